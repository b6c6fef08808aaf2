#!/usr/bin/env python
"""How tight is the error model?  Slack measured, not only kills.

For every op x dtype x family (accuracy: the forward; gradients: the VJP), over the registry's
correct kernels (every backend given by ``--backends``, case studies excluded: they are
registered as wrong) and the meta-tests' correct variants (``properties.meta.planted``, ``@correct``),
on ``--seeds`` seeds of the family's own strategy ("search" rows of the table) and, for a centred
op, its near-constant buckets ("near-const" rows: offset rows whose mean cancels, where every
element is a cancelling one), each case measured as the family's check measures it:

    worst      the largest error / bound a correct kernel shows (<= 1 passes); 1 / worst is how
               many times the bound exceeds the worst error seen: the issue's target is <= 4
    kernel     the kernel that showed it
    bnd/|y|    median and 90th percentile of bound / |exact| over the *ordinary* elements:
               finite, claimed, |exact_i| >= a quarter of the rms of its row's exact values (not a
               cancelling element) and at least the output format's smallest normal
    >|y|       the fraction of ordinary elements whose bound exceeds |exact| itself: there a
               kernel returning 0 would pass

Quantised outputs (FP8) are checked to the step (``assessment.assess``): only their worst is shown.

    python benchmarks/tightness.py                       # every op, eager + triton, 10 seeds
    python benchmarks/tightness.py --ops layer_norm --seeds 3 --backends eager
"""
from __future__ import annotations

import argparse
import platform
import time
from collections import defaultdict

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings

from normcert import impls, oracle
from normcert.impls import interpreter
from normcert.oracle import OPS, assessment
from normcert.oracle.formats import DTYPE_NAMES, DTYPES, fmt
from normcert.properties.certificate import cpu_name
from normcert.properties.families import BY_NAME
from normcert.properties.case import valid_positions
from normcert.properties.checks.gradients import case_cotangents, fresh_leaves
from normcert.properties.fitting import fit
from normcert.properties.measure import oracle_assessments
from normcert.properties.strategies import near_constant_buckets

FAMILIES = ("accuracy", "gradients")


def kernels(backends: tuple[str, ...], ops) -> list:
    """The registry's correct kernels of ``backends`` and the meta-tests' correct variants."""
    impls.ensure_triton_mode("cpu" if not torch.cuda.is_available() else "cuda")
    interpreter.install()  # on CPU: the interpreter corrected to compute what a GPU does, as a run does
    found = [i for i in impls.registry() if i.backend in backends and not i.expected_failure and i.op in ops]
    from normcert.properties.meta import planted  # the meta-tests' catalogue (it imports Triton too)
    from normcert.properties.meta.expect import catalogue
    found += [impls.make(op, fn.__name__, "plugin", fn) for op, fn, _ in catalogue(planted, "correct") if op in ops]
    return found


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


def ordinary(exact: np.ndarray, bound: np.ndarray, tiny: float) -> np.ndarray:
    """Finite, claimed elements with |exact| >= rms(row) / 4 (rows: the last dim) and >= tiny, the
    output format's smallest normal (below it the bound's underflow floors rightly dominate)."""
    with np.errstate(all="ignore"):
        finite = np.isfinite(exact) & np.isfinite(bound)
        e = np.where(finite, exact, 0.0)
        rms = np.sqrt(np.mean(e * e, axis=-1, keepdims=True)) if e.ndim else np.abs(e)
        return finite & (np.abs(e) >= rms / 4) & (np.abs(e) >= tiny)


class Cell:
    """One (op, dtype, family): the worst error / bound and the ordinary elements' bound / |exact|."""

    def __init__(self):
        self.worst, self.kernel, self.ratios, self.cases = 0.0, "", [], 0

    def add(self, kernel: str, a: assessment.Assessment, exact, bound, form, quantised: bool = False) -> None:
        if np.isfinite(a.max_units) and a.max_units >= self.worst:
            self.worst, self.kernel = a.max_units, kernel
        if not quantised:
            keep = ordinary(np.asarray(exact, dtype=np.float64), np.asarray(bound, dtype=np.float64), form.lam)
            self.ratios.append((np.asarray(bound)[keep] / np.abs(np.asarray(exact)[keep])).ravel())


def measure(impl, case, family: str, cell: Cell) -> None:
    """One case's assessments, measured as the family's check measures them (the accuracy check's
    valid positions, the gradients check's masked cotangents)."""
    rec = case.record
    args = case.oracle_args()
    if family == "accuracy":
        outs = rec.call_outputs(impl.fn, dict(args))
        for a, e, b in oracle_assessments(outs, case, where=valid_positions(case)):
            cell.add(impl.id, a, e, b, rec.out_format(a.name, args), rec.is_quantised(a.name, args))
        return
    _, leaves = fresh_leaves(case)
    names = list(leaves)
    with torch.enable_grad():
        outs = rec.call_outputs(impl.fn, {**args, **leaves})
    cot = case_cotangents(case, outs)
    grads = torch.autograd.grad(outs, [leaves[k] for k in names], cot, allow_unused=True)
    exact = oracle.vjp(case.op, cot, **args)
    bounds = rec.grad_bound(args, cot, exact)
    for k, g in zip(names, grads):
        if g is not None:
            a = assessment.assess("d" + k, g, exact[k], bounds[k], g.dtype)
            cell.add(impl.id, a, exact[k], bounds[k], fmt(g.dtype))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--examples", type=int, default=10, help="random cases per (kernel, family, dtype, seed)")
    p.add_argument("--backends", default="eager,triton")
    a = p.parse_args()
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
                    cases += [("near-const", draw(strategy(impl.op, dtype, "cpu", bucket=b), 1, s)[0])
                              for b in near_constant_buckets(OPS[impl.op], s)]
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
    print(f"{'op':<18} {'dtype':<9} {'family':<10} {'cases':<10} {'n':>4} {'worst':>7} {'bound/worst':>11} "
          f"{'bnd/|y| med':>11} {'p90':>9} {'>|y|':>7}  worst kernel")
    for (op, dtype, family, rows), c in sorted(cells.items()):
        r = np.concatenate(c.ratios) if c.ratios else np.zeros(0)
        med, p90, over = (f"{np.median(r):.3g}", f"{np.quantile(r, 0.9):.3g}", f"{np.mean(r > 1):.1%}") if r.size \
            else ("-", "-", "-")
        print(f"{op:<18} {dtype:<9} {family:<10} {rows:<10} {c.cases:>4} {c.worst:>7.3f} "
              f"{(1 / c.worst if c.worst else float('inf')):>11.3g} {med:>11} {p90:>9} {over:>7}  {c.kernel}")


if __name__ == "__main__":
    main()
