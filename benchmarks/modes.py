#!/usr/bin/env python
"""What does each calling mode cost?  The served family timed with one mode at a time.

The served family (``properties.families.served``) calls each of its cases once under every
calling mode that applies (``properties.search.modes``).  For one kernel (default: the registry's eager
RMSNorm) and each dtype, this prints the accuracy family's time (the kernel called as a test
calls it: the baseline) and the served family's time with only one mode at a time, then with
every mode, on the same cases (the ci profile's examples, seeded), side by side in one run.  A
mode's cost is its row minus the "(no mode)" row, where the served family draws its cases and
calls nothing.

    python benchmarks/modes.py                          # rms_norm, eager, float32 and bfloat16
    python benchmarks/modes.py --impl rms_norm=mykern:rms_norm --dtypes float32 --repeats 3
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import torch
from hypothesis import settings

from normcert import impls
from normcert.oracle.formats import DTYPE_NAMES
from normcert.properties.search import modes
from normcert.properties.run import runner
from normcert.properties.evidence.certificate import cpu_name
from normcert.properties.families import BY_NAME
from normcert.properties.harness.run_settings import PROFILES
from normcert.properties.harness.session import Session


def timed_family(impl, family: str, dtype, repeats: int, only=None) -> tuple[float, str]:
    """Median seconds of ``family`` on ``impl`` in ``dtype`` (a fresh session each time, so each
    run meets the same first call), with ``modes.MODES`` cut to ``only`` where given; and its outcome."""
    times, outcome = [], ""
    for _ in range(repeats):
        with mock.patch.object(modes, "MODES", only) if only is not None else contextlib.nullcontext():
            session = Session(seed=0)  # neither family reads session.eager (the fusion family's reference)
            started = time.perf_counter()
            res = runner.run_family(session, BY_NAME[family], impl, dtype)
            times.append(time.perf_counter() - started)
            outcome = res.outcome
    return statistics.median(times), outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="rms_norm=normcert.impls.eager:rms_norm", metavar="OP=MODULE:ATTR")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    names = {v: k for k, v in DTYPE_NAMES.items()}
    bad = [d for d in a.dtypes.split(",") if d not in names]
    if bad:
        p.error(f"--dtypes: unknown dtype {bad[0]!r}, expected some of {', '.join(names)}")
    for name, examples in PROFILES.items():
        settings.register_profile(name, max_examples=examples, deadline=None)
    settings.load_profile("ci")
    impl = impls.plugin(a.impl)
    print(f"# calling modes: {impl.id}, the ci profile ({PROFILES['ci']} examples), median of {a.repeats}; "
          f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'dtype':<9} {'family':<10} {'modes':<44} {'s':>7}  outcome")
    for d in a.dtypes.split(","):
        dtype = names[d]
        timed_family(impl, "accuracy", dtype, 1)  # warm-up: imports, the first call, the oracle's C kernels
        rows = [("accuracy", "grad on (as tested)", None)]
        rows.append(("served", "(no mode)", ()))
        rows += [("served", m.name, (m,)) for m in modes.MODES]
        rows.append(("served", "every mode", modes.MODES))
        for family, label, only in rows:
            seconds, outcome = timed_family(impl, family, dtype, a.repeats, only)
            print(f"{d:<9} {family:<10} {label:<44} {seconds:>7.2f}  {outcome}")


if __name__ == "__main__":
    main()
