#!/usr/bin/env python
"""What a user gets back for each planted bug: the reported case against the smallest failing one.

For every planted bug of the catalogue (``properties/tests/meta/planted``: ``@bug`` and
``@bucket_bug`` kernels), each family it is declared to fail and each dtype, this runs the family
as ``normcert certify`` does (``runner.run_family``, a fresh session on seed 0, the ci profile, the
cell's failures reported one at a time) and prints, for every dtype where it fails:

    reported   the elements of the reported case's main tensor (its shape), and how it is named
               ("shrunk", "reduced: budget spent", "not shrunk: ...")
    smallest   the fewest elements of a failing case a bounded exhaustive search finds (failing the
               same check the same way): main tensors of rank 2, R rows x n columns for R in 1, 2, 4
               and n each multiple of the op's width step (its width multiple, the declared domain's)
               up to 64 / R, so at most 64 elements; at each shape the op's sample, the reported
               case's first R rows and its columns around the failing element, and 4 cases drawn by
               the family's own strategy (seeds 0-3), each cut to the shape and fitted into the
               kernel's domain; "-" where none of them fails (a bug of large shapes only)
    first      seconds to the first counterexample (the news line ``normcert certify`` prints)
    cert       seconds the family's whole run took (search, reduction, other kinds of failure)
    calls      kernel calls made after the first counterexample (the reduction's and Hypothesis's)

then the goals: the reported case within 2x the smallest's elements for 90 % of failures, never over
64 elements where a case of <= 16 fails.  ``--mode hypothesis`` runs the search with Hypothesis's
own shrinking and without ``properties.run.reduce`` (its context step alone, as before it):
the figures before the reducer.

    python benchmarks/shrink.py                                   # the whole catalogue (long)
    python benchmarks/shrink.py --only rms_ ln_ --dtypes float32  # a subset, by name prefix
    python benchmarks/shrink.py --mode hypothesis --only rms_no_upcast
    python benchmarks/shrink.py --shard 1/2 > a.txt & python benchmarks/shrink.py --shard 2/2 > b.txt
                                                                  # the catalogue on two cores
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import tempfile
import time
from dataclasses import replace
from unittest import mock

import torch
from hypothesis import Phase, given, seed, settings

from normcert.oracle.formats import DTYPE_NAMES
from normcert.properties.declared.domain import Domain
from normcert.properties.evidence.certificate import cpu_name
from normcert.properties.evidence.replay import load
from normcert.properties.families import BY_NAME
from normcert.properties.harness.measure import PropertyFailure, Worst
from normcert.properties.harness.run_settings import PROFILES
from normcert.properties.harness.session import Session
from normcert.properties.run import reduce as reducer
from normcert.properties.run import runner
from normcert.properties.search.case import Case
from normcert.properties.search.constants import own_constants_only
from normcert.properties.search.fitting import fit
from normcert.properties.tests.meta import expect, planted

from context import counted  # noqa: E402 - a sibling script (benchmarks/ is on sys.path when run)

DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
ROWS = (1, 2, 4)
MOST = 64
DRAWS = 4


def _context_only(search, case, message, kind, budget=reducer.BUDGET):
    """The reduction before ``reduce``: the calling context put back to as tested, nothing else."""
    calls = 0
    for _, candidate in list(reducer._contexts(search, case)):
        calls += 1
        said = reducer._same(search, candidate, kind)
        if said is not None:
            case, message = candidate, said
    return case, message, reducer.Reduction(calls=calls, steps=("Hypothesis's shrinking",))


def one(impl, family, dtype, mode: str, folder: str) -> dict | None:
    """The family's run on ``impl`` in ``dtype``: None where it does not fail, else the figures."""
    mine, calls = counted(impl)
    session = Session(seed=0, failures_dir=folder, most_failures=runner.MOST_FAILURES)
    first = []
    said = lambda line: first.append((time.perf_counter(), calls[0]))  # noqa: E731
    patches = [mock.patch.object(runner, "say", said)]
    if mode == "hypothesis":
        patches += [mock.patch.object(runner, "reduce", _context_only),
                    mock.patch.object(runner, "_NO_SHRINK", tuple(Phase))]
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        said_as = ""
        try:
            runner.run_family(session, family, mine, dtype)
        except PropertyFailure as e:
            said_as = str(e).split("\n")[1].strip() if "\n" in str(e) else ""
    seconds = time.perf_counter() - started
    res = session.results[-1]
    if res.outcome != "fail" or not res.failures:
        return None
    path = res.replay.split()[-1]
    _, case = load(path, "cpu")
    return {"case": case, "kind": res.failures[0]["kind"], "where": res.worst_where, "seconds": seconds,
            "first": (first[0][0] - started) if first else math.nan,
            "after": calls[0] - (first[0][1] if first else 0), "session": session, "impl": mine,
            "named": said_as.split(f": {impl.op}(")[0]}


def cut(case: Case, rows: int, width: int, domain: Domain) -> Case | None:
    """``case`` made rank 2 with its first ``rows`` rows (None where it has fewer) and ``width``
    columns (its first, tiled where it has fewer), fitted into ``domain``."""
    if case.record.counts is not None or case.main.dim() == 0:
        return None
    flat = fit(case, replace(domain, ranks=(2,)))
    if flat.main.shape[0] < rows:
        return None
    flat = reducer._along_rows(flat, lambda t: t[:rows])
    return fit(flat, replace(domain, ranks=(2,), max_width=width))


def drawn(family, impl, dtype) -> list[Case]:
    """DRAWS cases of the family's own strategy (seeds 0..DRAWS-1, no shrinking)."""
    out = []
    strategy = family.cases(impl.op, dtype, "cpu")
    for k in range(DRAWS):
        @seed(k)
        @settings(max_examples=1, phases=(Phase.generate,), database=None, deadline=None)
        @given(case=strategy)
        def collect(case):
            out.append(case)
        with own_constants_only():
            collect()
    return out


def smallest(found: dict, family, dtype) -> tuple[int, str] | None:
    """(elements, shape) of the smallest case failing ``family``'s check the way ``found`` did,
    among the module docstring's shapes; None where none of them does."""
    impl, session, reported = found["impl"], found["session"], found["case"]
    rec = reported.record
    step = replace(impl.domain, max_width=None).width(1, rec.halves, rec.width_multiple)
    shapes = sorted({(r * n, r, n) for r in ROWS for n in range(step, MOST // r + 1, step)})
    search = type("S", (), {})()
    search.prop, search.check, search.session, search.impl = family.name, family.check, session, impl
    search.forcing = session.forcing(impl)
    sources = [reported] + drawn(family, impl, dtype)
    for elements, r, n in shapes:
        tries = [Case.sample(rec.name, dtype, rows=r, width=n)] + [cut(c, r, n, impl.domain) for c in sources]
        for c in tries:
            if c is None:
                continue
            c = fit(c.copy(context=reported.context, config=reported.config), impl.domain)
            if c.main.numel() > MOST:
                continue
            if reducer._same(search, c, found["kind"]) is not None:
                return c.main.numel(), "x".join(map(str, c.main.shape))
    return None


def catalogue(only, families_only, shard: tuple[int, int]) -> list[tuple[str, object, set[str]]]:
    """The planted bugs to run: those named by ``only`` (all where empty), the ``shard[0]``-th of
    every ``shard[1]`` in catalogue order, each with its declared families (those of ``families_only``)."""
    bugs = expect.catalogue(planted, "bug") + expect.catalogue(planted, "bucket_bug")
    chosen = [(op, fn, {f for f in fams if not families_only or f in families_only}) for op, fn, fams in bugs
              if not only or any(fn.__name__.startswith(p) for p in only)]
    k, n = shard
    return chosen[k - 1::n]


def _shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"expected K/N with 1 <= K <= N, got {text!r}")
    return int(k), int(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=(), metavar="PREFIX", help="planted kernels whose name starts so")
    p.add_argument("--families", nargs="*", default=(), metavar="FAMILY")
    p.add_argument("--dtypes", nargs="*", default=tuple(DTYPES), choices=tuple(DTYPES))
    p.add_argument("--mode", default="reduce", choices=("reduce", "hypothesis"))
    p.add_argument("--no-smallest", action="store_true", help="skip the exhaustive search")
    p.add_argument("--shard", type=_shard, default=(1, 1), metavar="K/N",
                   help="run the K-th of every N planted bugs (one process per core)")
    a = p.parse_args()
    for name, examples in PROFILES.items():
        settings.register_profile(name, max_examples=examples, deadline=None)
    settings.load_profile("ci")
    torch.set_num_threads(1)
    print(f"# shrink: planted catalogue, mode {a.mode}, ci profile ({PROFILES['ci']} examples), seed 0; "
          f"{cpu_name()}, torch {torch.__version__}, 1 thread, shard {a.shard[0]}/{a.shard[1]}")
    print(f"{'kernel':<34} {'family':<14} {'dtype':<9} {'reported':>9} {'shape':<14} {'smallest':>8} "
          f"{'first s':>7} {'cert s':>7} {'calls':>6}  named")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for op, fn, families in catalogue(a.only, a.families, a.shard):
            impl = expect.registered(op, fn)
            for name in sorted(families):
                family = BY_NAME[name]
                for dtype_name in a.dtypes:
                    found = one(impl, family, DTYPES[dtype_name], a.mode, folder)
                    if found is None:
                        continue
                    case = found["case"]
                    small = None if a.no_smallest else smallest(found, family, DTYPES[dtype_name])
                    rows.append((case.main.numel(), small[0] if small else None))
                    print(f"{fn.__name__:<34} {name:<14} {dtype_name:<9} {case.main.numel():>9} "
                          f"{'x'.join(map(str, case.main.shape)):<14} "
                          f"{(str(small[0]) + ' ' + small[1]) if small else '-':>8} {found['first']:>7.2f} "
                          f"{found['seconds']:>7.2f} {found['after']:>6}  {found['named'][:70]}", flush=True)
    measured = [(r, s) for r, s in rows if s is not None]
    within = sum(r <= 2 * s for r, s in measured)
    over = [(r, s) for r, s in measured if s <= 16 and r > MOST]
    print(f"# {len(rows)} failures; with a smallest found: {len(measured)}; reported within 2x the smallest: "
          f"{within} of {len(measured)} ({100 * within / max(len(measured), 1):.0f} %, goal 90 %); over {MOST} "
          f"elements where <= 16 fails: {len(over)} (goal 0); median reported "
          f"{statistics.median([r for r, _ in rows]) if rows else 0} elements")


if __name__ == "__main__":
    main()
