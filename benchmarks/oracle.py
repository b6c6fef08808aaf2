#!/usr/bin/env python
"""How fast is the oracle?  Every op, forward, at a few sizes, on three paths:

    naive     the oracle's maths with mpmath (256 bits) one element at a time,
              every sum a left-to-right Python loop: the baseline
    mpmath    oracle.forward(op, path="mpmath")
    float64   oracle.forward(op, path="float64"), the float64-exact path

plus the registry's eager torch kernel (``impls.eager``, torch ops in float64)
measured in the same run, so the float64 path's cost can be read as a ratio
to it.  Times are medians of repeats, in milliseconds.

Where a path would take too long (mpmath or naive estimated over
``--budget`` seconds per call) the mpmath cell says "skipped (too slow)"; the
naive baseline is then *measured on a subset* of rows (positions for
batch_norm) and scaled linearly, marked "~"; deep_norm's cost grows as rows * n**2
and its float64 oracle materialises rows * n * (n + 2) terms, so its larger
sizes are skipped.

    python benchmarks/oracle.py            # all ops, 8x64 .. 64x8192 (~3 min)
    python benchmarks/oracle.py --quick    # 8x64 and 64x4096 only
    python benchmarks/oracle.py --vjp      # also time the float64 VJP against torch autograd
    python benchmarks/oracle.py --plot oracle.svg   # also the figure: ms against elements (the plots extra)
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import mpmath
import numpy as np
import torch

from normcert import oracle
from normcert.impls import eager
from normcert.oracle.backends import MP_PREC
from normcert.oracle.kinds import KINDS
from normcert.oracle.mpmath_backend import MPExact
from normcert.properties.evidence.certificate import cpu_name

import plots  # beside this script

SIZES = ((8, 64), (64, 1024), (64, 4096), (64, 8192))
QUICK_SIZES = ((8, 64), (64, 4096))
MATRIX_MAX_TERMS = 1 << 24  # rows * n * (n + 2) a float64 oracle with a matrix argument may materialise


# ------------------------------------------------------------------ machine


def machine() -> list[str]:
    model = cpu_name()
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return [
        f"cpu:     {model}",
        f"cores:   {os.cpu_count()} logical; torch intra-op threads {torch.get_num_threads()}",
        f"torch:   {torch.__version__}   numpy {np.__version__}   mpmath {mpmath.__version__}   "
        f"python {platform.python_version()}",
        f"load:    {load} (1/5/15 min) at start",
    ]


# ------------------------------------------------------------------ inputs


def make_args(op: str, rows: int, n: int, seed: int = 0) -> dict:
    """float64 arguments of ``op`` at rows x n (2n wide where the op splits rows in halves):
    the op record's sample input."""
    rec = oracle.OPS[op]
    return rec.sample(torch.float64, rows=rows, width=2 * n if rec.halves else n, seed=seed)


# ------------------------------------------------------------------ the eager kernel, in float64


def torch_fn(op: str, a: dict):
    """A thunk running the registry's eager torch kernel (``impls.eager``) on ``a`` (float64)."""
    rec, fn = oracle.OPS[op], getattr(eager, op)
    return lambda: rec.call(fn, a), f"impls.eager.{op}"


def torch_vjp_fn(op: str, a: dict):
    """A thunk running the eager kernel's float64 forward + autograd backward."""
    rec, fn = oracle.OPS[op], getattr(eager, op)

    def f():
        leaves = {k: a[k].detach().requires_grad_(True) for k in rec.grads}
        out = rec.call_outputs(fn, {**a, **leaves})
        torch.autograd.backward(out, [torch.ones_like(t) for t in out])
        return [leaves[k].grad for k in rec.grads]

    return f


# ------------------------------------------------------------------ the naive baseline


class NaiveLoops(MPExact):
    """The mpmath backend with every reduction a plain left-to-right loop, ``acc += term``:
    the oracle's maths as someone would first write it, one mpf at a time."""

    name = "naive"

    def row_sum(self, a):
        return self._reduce(a, _loop_sum)

    def row_dot(self, a, b):
        a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        return self._reduce(a * b, _loop_sum)


def _loop_sum(terms):
    acc = mpmath.mpf(0)
    for t in terms:
        acc += t
    return acc


def naive(op: str, a: dict, part: int):
    """The op's oracle maths on ``NaiveLoops``, on the first ``part`` rows (positions for batch_norm)."""
    rec, B = oracle.OPS[op], NaiveLoops()
    first = {arg.name: a[arg.name][:part] for arg in rec.args
             if KINDS[arg.kind].shape in ("rows", "leading") and a.get(arg.name) is not None}
    if rec.counts and a[rec.main].dim() == 2:  # one expert, its first ``part`` tokens: at most part valid
        first[rec.counts] = a[rec.counts].clamp(max=part)
    kw = oracle.arguments(rec, B, {**a, **first})
    with mpmath.workprec(MP_PREC), np.errstate(all="ignore"):
        return rec.forward(B, **kw)


# ------------------------------------------------------------------ timing


def timed(fn, min_time=0.3, max_reps=50, min_reps=3) -> float:
    """Median wall time of fn() in seconds; the first call is a warm-up unless it takes over a second."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first > 1.0:
        return first
    reps = max(min_reps, min(max_reps, int(min_time / max(first, 1e-6))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def quadratic(op: str) -> bool:
    """The op applies an n x n matrix to every row (deep_norm's sublayer): rows * n * (n + 2) terms."""
    return any(arg.kind == "matrix" for arg in oracle.OPS[op].args)


def cost_units(op: str, rows: int, n: int) -> float:
    return rows * n * (n + 2) if quadratic(op) else rows * n


def fmt_ms(t: float | None) -> str:
    if t is None:
        return "-"
    ms = t * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:,.0f}"


def fmt_ratio(r: float | None) -> str:
    if r is None or not math.isfinite(r):
        return "-"
    return f"{r:.3g}x" if r < 1000 else f"{r:,.0f}x"


# ------------------------------------------------------------------ main


def run(ops, sizes, budget, do_vjp):
    """Print the tables; return (op, path, elements, ms) for every call timed (for ``--plot``)."""
    for line in machine():
        print(line)
    print(f"budget:  mpmath / naive calls estimated over {budget:g} s are skipped (naive: measured on a subset, "
          f"scaled, marked ~)")
    print()
    header = ("op", "size", "path", "ms", "vs naive", "vs torch f64", "torch f64 op")
    rows_out, points = [], []
    per_unit = {}  # (op, path) -> seconds per cost unit, from the largest size measured
    for op in ops:
        for rows, n in sizes:
            a = make_args(op, rows, n)
            size = f"{rows}x{n}"
            units = cost_units(op, rows, n)
            tfn, tname = torch_fn(op, a)
            t_torch = timed(tfn)

            # naive baseline: measured, or measured on a subset and scaled
            est = per_unit.get((op, "naive"), 0.0) * units
            if quadratic(op) and est > budget * 6:
                t_naive, naive_note = est, "~"  # even one row is too slow: scale the smallest size
            elif est <= budget:
                t_naive, naive_note = timed(lambda: naive(op, a, rows),
                                            min_time=0.5, max_reps=5, min_reps=1), ""
                per_unit[(op, "naive")] = t_naive / units
            else:
                part = max(1, int(rows * budget / est / 4))
                t_naive, naive_note = once(lambda: naive(op, a, part)) * rows / part, "~"
            # mpmath path
            est = per_unit.get((op, "mpmath"), 0.0) * units
            if est <= budget:
                t_mp = timed(lambda: oracle.forward(op, path="mpmath", **a), min_time=0.5, max_reps=5, min_reps=1)
                per_unit[(op, "mpmath")] = t_mp / units
                mp_cell = fmt_ms(t_mp)
            else:
                t_mp, mp_cell = None, "skipped (too slow)"
            # float64-exact path
            if quadratic(op) and rows * n * (n + 2) > MATRIX_MAX_TERMS:
                t_f64, f64_cell = None, "skipped (rows*n*(n+2) terms)"
            else:
                t_f64 = timed(lambda: oracle.forward(op, path="float64", **a))
                f64_cell = fmt_ms(t_f64)
            points += [(op, path, rows * n, t * 1e3) for path, t in  # measured times only: no scaled estimate
                       (("naive", None if naive_note else t_naive), ("mpmath", t_mp), ("float64", t_f64),
                        ("torch float64", t_torch)) if t is not None]
            rows_out.append((op, size, "naive", naive_note + fmt_ms(t_naive), "1x", "", ""))
            rows_out.append((op, size, "mpmath", mp_cell, fmt_ratio(t_naive / t_mp) if t_mp else "-", "", ""))
            rows_out.append((op, size, "float64", f64_cell, fmt_ratio(t_naive / t_f64) if t_f64 else "-",
                             fmt_ratio(t_f64 / t_torch) if t_f64 else "-", f"{fmt_ms(t_torch)} ms ({tname})"))
            sys.stdout.flush()
    print_table(header, rows_out)
    print()
    print('"vs naive": speed-up over the naive baseline (its time / this time); "vs torch f64": this time / '
          "torch's float64 eager op's time, same inputs, same run.")
    if do_vjp:
        print()
        vrows = []
        for op in (op for op in ops if oracle.OPS[op].grads):  # the FP8 ops have no backward
            for rows, n in sizes:
                if quadratic(op) and rows * n * (n + 2) > MATRIX_MAX_TERMS:
                    continue
                a = make_args(op, rows, n)
                fwd = oracle.forward(op, path="float64", **a)
                cot = tuple(torch.ones(o.shape, dtype=torch.float64) for o in fwd)
                t_vjp = timed(lambda: oracle.vjp(op, cot, path="float64", **a))
                t_tb = timed(torch_vjp_fn(op, a))
                vrows.append((op, f"{rows}x{n}", fmt_ms(t_vjp), fmt_ms(t_tb), fmt_ratio(t_vjp / t_tb)))
        print_table(("op", "size", "float64 vjp ms", "torch f64 fwd+bwd ms", "ratio"), vrows)
    if hasattr(os, "getloadavg"):
        print()
        print("load at end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    return points


def print_table(header, rows):
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(str(h).ljust(w) for h, w in zip(header, widths))
    print(line)
    print("  ".join("-" * w for w in widths))
    prev = None
    for r in rows:
        cells = list(r)
        if prev is not None and (cells[0], cells[1]) == prev:
            cells[0] = cells[1] = ""
        else:
            prev = (r[0], r[1])
        print("  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) if i < 6 else str(c)
                        for i, (c, w) in enumerate(zip(cells, widths))).rstrip())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="sizes 8x64 and 64x4096 only")
    p.add_argument("--ops", default=",".join(oracle.OPS), help="comma-separated ops (default: all)")
    p.add_argument("--sizes", default=None, help="comma-separated ROWSxN, e.g. 8x64,64x4096")
    p.add_argument("--budget", type=float, default=10.0,
                   help="seconds one mpmath / naive call may take before it is skipped or scaled (default 10)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--vjp", action="store_true", help="also time the float64 VJP against torch autograd")
    p.add_argument("--plot", metavar="PATH", help="also draw ms per call against elements (``plots.oracle_cost``)")
    args = p.parse_args(argv)
    if args.plot and plots.require():
        p.error(plots.require())
    if args.threads:
        torch.set_num_threads(args.threads)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in oracle.OPS:
            p.error(f"unknown op {o!r}; expected one of {', '.join(oracle.OPS)}")
    if args.sizes:
        sizes = tuple(tuple(int(v) for v in s.lower().split("x")) for s in args.sizes.split(","))
    else:
        sizes = QUICK_SIZES if args.quick else SIZES
    points = run(ops, sizes, args.budget, args.vjp)
    if args.plot:
        plots.oracle_cost(points, args.plot, title=f"oracle cost; {cpu_name()}, torch {torch.__version__}")
        print(f"figure: {args.plot}")


if __name__ == "__main__":
    main()
