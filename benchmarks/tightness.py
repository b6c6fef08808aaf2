#!/usr/bin/env python
"""How tight is the error model?  Slack measured, not only kills.

For every op x dtype x family (accuracy: the forward; gradients: the VJP), over the registry's
correct kernels (every backend given by ``--backends``, case studies excluded: they are
registered as wrong) and the meta-tests' correct variants (``properties.tests.meta.planted``, ``@correct``),
on ``--seeds`` seeds of the family's own strategy ("search" rows of the table) and the near-constant
buckets ("near-const" rows).  The suite schedules those for a centred op (offset rows whose mean
cancels); the benchmark adds them for every other normalising op (``Op.scale_invariant``: the
RMSNorm family) too, as the rows where a correct kernel's roundings do not cancel: n equal squares
summed left to right err coherently, so the gam(n) terms of the bounds are measured against a
kernel that reaches them, which random rows never do (a float32 rms_sequential_sum reaches about
0.2 of its bound on constant rows at every width, and 0.005 on random rows of 16384).  And for
every op that normalises x itself (``Op.scale_invariant``), "round-up" rows: each near-constant
case with its groups replaced by ``strategies.round_up_row``, whose sum (of squares; a centred op's
mean's sum) rounds up at every step when taken left to right, the data on which the meta-tests'
sequential-sum variants reach the gam(n) terms themselves (0.99 of the bound in float32 for the
RMSNorm family).  Each case is measured as the family's check measures it:

    worst      the largest error / bound a correct kernel shows (<= 1 passes); 1 / worst is how
               many times the bound exceeds the worst error seen: the issue's target is <= 4
    kernel     the kernel that showed it
    bnd/|y|    median and 90th percentile of bound / |exact| over the *ordinary* elements:
               finite, claimed, not cancelling (``conditioning``: a relative move of every input
               amplified at most WELL_CONDITIONED times there) and at least the output format's
               smallest normal
    >|y|       the fraction of ordinary elements whose bound exceeds |exact| itself: there a
               kernel returning 0 would pass

Quantised outputs (FP8) are checked to the step (``assessment.assess``): only their worst is shown.

    python benchmarks/tightness.py                       # every op, eager + triton, 10 seeds
    python benchmarks/tightness.py --ops layer_norm --seeds 3 --backends eager
    python benchmarks/tightness.py --plot tightness.svg     # also the figure (the plots extra)
"""
from __future__ import annotations

import argparse
import platform
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings

from normcert import impls, oracle
from normcert.properties.harness import interpreter
from normcert.oracle import OPS, assessment
from normcert.oracle.formats import DTYPE_NAMES, DTYPES, fmt
from normcert.properties.evidence.certificate import cpu_name
from normcert.properties.families import BY_NAME
from normcert.properties.search.case import valid_positions
from normcert.properties.families.gradients import case_cotangents, fresh_leaves
from normcert.properties.search.fitting import fit
from normcert.properties.harness.measure import oracle_assessments
from normcert.properties.search.buckets import near_constant_buckets
from normcert.properties.search.strategies import round_up_row

import plots  # beside this script

FAMILIES = ("accuracy", "gradients")


def kernels(backends: tuple[str, ...], ops) -> list:
    """The registry's correct kernels of ``backends`` and the meta-tests' correct variants."""
    impls.ensure_triton_mode("cpu" if not torch.cuda.is_available() else "cuda")
    interpreter.install()  # on CPU: the interpreter corrected to compute what a GPU does, as a run does
    found = [i for i in impls.registry() if i.backend in backends and not i.expected_failure and i.op in ops]
    from normcert.properties.tests.meta import planted  # the meta-tests' catalogue (it imports Triton too)
    from normcert.properties.tests.meta.expect import catalogue
    found += [impls.make(op, fn.__name__, "plugin", fn) for op, fn, _ in catalogue(planted, "correct") if op in ops]
    return found


def coherent_buckets(rec, spin: int) -> tuple:
    """The near-constant buckets of a centred op, and of any other normalising op as if it were one
    (rows whose sums round coherently; the suite does not schedule them there)."""
    return near_constant_buckets(replace(rec, centred=True) if rec.scale_invariant else rec, spin)


def round_up_case(case):
    """``case`` with every group its op normalises (a row; batch_norm's: a channel over positions)
    a ``round_up_row`` of the sum that op takes first (a centred op's mean: power 1; else the sum of
    squares), its residual streams zero (x + 0 is exact, so a fused op normalises the same rows) and
    no mask; its other inputs as drawn."""
    rec, main = case.record, case.main
    power = 1 if rec.centred else 2
    if rec.rowwise:
        x = round_up_row(main.shape[-1], main.dtype, power).expand(main.shape)
    else:
        positions = main.numel() // max(main.shape[-1], 1)
        x = round_up_row(positions, main.dtype, power)[:, None].expand(positions, main.shape[-1]).reshape(main.shape)
    zeros = {a.name: torch.zeros_like(case.tensors[a.name]) for a in rec.args
             if a.kind == "stream" and case.tensors.get(a.name) is not None}
    masks = {rec.mask: None} if rec.mask else {}
    return case.replace(**{rec.main: x.clone()}, **zeros, **masks)


def draw(strategy, count: int, at: int) -> list:
    """``count`` cases of ``strategy`` as Hypothesis generates them under seed ``at`` (no shrinking)."""
    out = []

    @seed(at)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case):
        out.append(case)

    collect()
    return out[:count]


NUDGE = 2.0 ** -30  # the largest relative move of an input in the nudges that measure conditioning
NUDGES = 2
WELL_CONDITIONED = 8.0  # kappa at most this: an ordinary element (at most 3 bits lost to cancellation)


def nudged(args: dict, rng) -> dict:
    """args with every floating tensor widened to float64 and each element moved by up to NUDGE
    relative (uniform, so that no row moves by one common factor, which a norm would not see):
    inputs no dtype can hold, which the oracle evaluates exactly all the same."""
    out = {}
    for k, t in args.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            t = t.double()
            t = t * (1 + NUDGE * torch.from_numpy(rng.uniform(-1.0, 1.0, tuple(t.shape))))
        out[k] = t
    return out


def conditioning(exact, moved) -> np.ndarray:
    """kappa_i = max over the nudges |moved_i - exact_i| / (NUDGE |exact_i|): how much a relative
    move of the inputs is amplified in element i (a lower estimate of its condition number).
    Large where the element's terms cancel: an entry near its row's mean, a row whose mean
    dwarfs its spread, LayerNorm's dx on two elements (x_hat = +-1 whatever x is, so dx ~ 0
    while its terms are not)."""
    e = np.asarray(exact, dtype=np.float64)
    with np.errstate(all="ignore"):
        return np.max([np.abs(np.asarray(m, dtype=np.float64) - e) for m in moved], axis=0) / (NUDGE * np.abs(e))


def ordinary(exact: np.ndarray, bound: np.ndarray, kappa: np.ndarray, tiny: float) -> np.ndarray:
    """Finite, claimed elements that do not cancel (``conditioning`` at most WELL_CONDITIONED over
    NUDGES random nudges of every input) and are at least tiny, the output format's smallest normal
    (below it the bound's underflow floors rightly dominate)."""
    with np.errstate(all="ignore"):
        finite = np.isfinite(exact) & np.isfinite(bound) & np.isfinite(kappa)
        return finite & (kappa <= WELL_CONDITIONED) & (np.abs(np.where(finite, exact, 0.0)) >= tiny)


class Cell:
    """One (op, dtype, family): the worst error / bound and the ordinary elements' bound / |exact|."""

    def __init__(self):
        self.worst, self.kernel, self.ratios, self.cases = 0.0, "", [], 0

    def add(self, kernel: str, a: assessment.Assessment, exact, bound, moved, form, quantised: bool = False) -> None:
        if np.isfinite(a.max_units) and a.max_units >= self.worst:
            self.worst, self.kernel = a.max_units, kernel
        if not quantised:
            exact, bound = np.asarray(exact, dtype=np.float64), np.asarray(bound, dtype=np.float64)
            keep = ordinary(exact, bound, conditioning(exact, moved), form.lam)
            self.ratios.append((np.broadcast_to(bound, exact.shape)[keep] / np.abs(exact[keep])).ravel())


def measure(impl, case, family: str, cell: Cell) -> None:
    """One case's assessments, measured as the family's check measures them (the accuracy check's
    valid positions, the gradients check's masked cotangents), each exact value beside its value
    at nudged inputs (``conditioning``)."""
    rec = case.record
    args = case.oracle_args()
    rng = np.random.default_rng(0)
    if family == "accuracy":
        outs = rec.call_outputs(impl.fn, dict(args))
        moved = [oracle.forward(case.op, **nudged(args, rng)) for _ in range(NUDGES)]
        for a, e, b in oracle_assessments(outs, case, where=valid_positions(case)):
            k = rec.outputs.index(a.name)
            cell.add(impl.id, a, e, b, [m[k] for m in moved], rec.out_format(a.name, args),
                     rec.is_quantised(a.name, args))
        return
    _, leaves = fresh_leaves(case)
    names = list(leaves)
    with torch.enable_grad():
        outs = rec.call_outputs(impl.fn, {**args, **leaves})
    cot = case_cotangents(case, outs)
    grads = torch.autograd.grad(outs, [leaves[k] for k in names], cot, allow_unused=True)
    exact = oracle.vjp(case.op, cot, **args)
    moved = [oracle.vjp(case.op, tuple(nudged({"c": c}, rng)["c"] for c in cot), **nudged(args, rng))
             for _ in range(NUDGES)]
    bounds = rec.grad_bound(args, cot, exact)
    for k, g in zip(names, grads):
        if g is not None:
            a = assessment.assess("d" + k, g, exact[k], bounds[k], g.dtype)
            cell.add(impl.id, a, exact[k], bounds[k], [m[k] for m in moved], fmt(g.dtype))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--examples", type=int, default=10, help="random cases per (kernel, family, dtype, seed)")
    p.add_argument("--backends", default="eager,triton")
    p.add_argument("--plot", metavar="PATH", help="also draw worst / bound per op x dtype (``plots.tightness``)")
    a = p.parse_args()
    if a.plot and plots.require():
        p.error(plots.require())
    ops = a.ops.split(",")
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        p.error(f"--ops: unknown op {unknown[0]!r}, expected some of {', '.join(OPS)}")
    started = time.time()
    found = kernels(tuple(a.backends.split(",")), ops)
    cells: dict = defaultdict(Cell)
    for impl in found:
        for family in FAMILIES:
            if family == "gradients" and (not OPS[impl.op].grads or impl.backward is False):
                continue
            for dtype in DTYPES:
                if not impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
                    continue
                strategy = BY_NAME[family].cases
                for s in range(a.seeds):
                    cases = [("search", c) for c in draw(strategy(impl.op, dtype, "cpu"), a.examples, s)]
                    coherent = [draw(strategy(impl.op, dtype, "cpu", bucket=b), 1, s)[0]
                                for b in coherent_buckets(OPS[impl.op], s)]
                    cases += [("near-const", c) for c in coherent]
                    if OPS[impl.op].scale_invariant:  # it normalises x itself (deep_norm: a sum)
                        cases += [("round-up", round_up_case(c)) for c in coherent]
                    for rows, case in cases:
                        cell = cells[(impl.op, DTYPE_NAMES[dtype], family, rows)]
                        cell.cases += 1
                        case = fit(case, impl.domain)
                        try:
                            measure(impl, case, family, cell)
                        except (TypeError, AttributeError):  # a kernel written for no None weight
                            measure(impl, case.with_identity(), family, cell)
    print(f"# tightness: {len(found)} kernels ({a.backends} + the meta-tests' correct variants), {a.seeds} seeds x "
          f"{a.examples} cases + the near-constant buckets; {cpu_name()}, {platform.python_version()}, "
          f"torch {torch.__version__}; {time.time() - started:.0f} s")
    header = (f"{len(found)} kernels ({a.backends} + correct variants), {a.seeds} seeds x {a.examples} cases; "
              f"{cpu_name()}, torch {torch.__version__}")
    print(f"{'op':<18} {'dtype':<9} {'family':<10} {'cases':<10} {'n':>4} {'worst':>7} {'bound/worst':>11} "
          f"{'bnd/|y| med':>11} {'p90':>9} {'>|y|':>7}  worst kernel")
    for (op, dtype, family, rows), c in sorted(cells.items()):
        r = np.concatenate(c.ratios) if c.ratios else np.zeros(0)
        med, p90, over = (f"{np.median(r):.3g}", f"{np.quantile(r, 0.9):.3g}", f"{np.mean(r > 1):.1%}") if r.size \
            else ("-", "-", "-")
        print(f"{op:<18} {dtype:<9} {family:<10} {rows:<10} {c.cases:>4} {c.worst:>7.3f} "
              f"{(1 / c.worst if c.worst else float('inf')):>11.3g} {med:>11} {p90:>9} {over:>7}  {c.kernel}")
    if a.plot:
        worst: dict = defaultdict(float)
        for (op, dtype, family, _), c in cells.items():
            worst[(op, dtype, family)] = max(worst[(op, dtype, family)], c.worst)
        plots.tightness(dict(worst), a.plot, title=header)
        print(f"figure: {a.plot}")


if __name__ == "__main__":
    main()
