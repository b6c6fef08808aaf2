#!/usr/bin/env python
"""What does each calling-context field cost?  accuracy and gradients timed with one field drawn at a time.

The accuracy and gradients families draw a calling context with each case
(``properties.search.context``; the fields each draws: ``families.accuracy.DRAWN``,
``families.gradients.DRAWN``).  For one kernel (default: the registry's eager RMSNorm) in one dtype,
this prints each family's wall time, the kernel calls it made and its checked cases, first with
every field pinned to the as-tested context, then with one field drawn at a time, then with every
field drawn (as ``normcert certify`` runs), on the ci profile's examples with the run's seed.  A
field's "off" column is the checked cases whose context took a value other than the as-tested one
in that field (the cases it adds); its cost is its row's time minus the pinned row's.

    python benchmarks/context.py                               # rms_norm, eager, float32
    python benchmarks/context.py --impl rms_norm=mykern:rms_norm --dtype bfloat16 --repeats 3

Fields are pinned by patching the families' ``DRAWN`` for the run (no switch in normcert itself).
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from unittest import mock

import torch
from hypothesis import settings

from normcert import impls
from normcert.oracle.formats import DTYPE_NAMES
from normcert.properties.evidence.certificate import cpu_name
from normcert.properties.families import BY_NAME, accuracy, gradients
from normcert.properties.evidence.replay import tested
from normcert.properties.harness.run_settings import PROFILES
from normcert.properties.harness.session import Session
from normcert.properties.run import runner

MODULES = {"accuracy": accuracy, "gradients": gradients}


def counted(impl):
    """``impl`` with its calls counted (in ``calls[0]``)."""
    calls = [0]

    def fn(*args, **kwargs):
        calls[0] += 1
        return impl.fn(*args, **kwargs)

    return replace(impl, fn=fn), calls


def timed(impl, family: str, dtype, drawn: tuple[str, ...], repeats: int):
    """Median seconds of ``family`` on ``impl`` with the context fields ``drawn`` (the others as
    tested), a fresh session each time; its kernel calls, checked cases, the checked cases off the
    as-tested value per field, and its outcome."""
    times, off = [], {}
    for _ in range(repeats):
        mine, calls = counted(impl)
        with mock.patch.object(MODULES[family], "DRAWN", drawn):
            session = Session(seed=0)
            started = time.perf_counter()
            res = runner.run_family(session, replace(BY_NAME[family], contexts=drawn), mine, dtype)
            times.append(time.perf_counter() - started)
    plain = tested(BY_NAME[family])
    for part in res.modes.removeprefix("contexts: ").split("; ") if drawn else ():
        name, _, values = part.partition(" ")
        counts = dict(v.rsplit(" ", 1) for v in values.split(", "))
        off[name] = sum(int(n) for v, n in counts.items() if v != getattr(plain, name))
    return statistics.median(times), calls[0], res.examples - res.refused, off, res.outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="rms_norm=normcert.impls.eager:rms_norm", metavar="OP=MODULE:ATTR")
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPE_NAMES.values()))
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    dtype = {v: k for k, v in DTYPE_NAMES.items()}[a.dtype]
    for name, examples in PROFILES.items():
        settings.register_profile(name, max_examples=examples, deadline=None)
    settings.load_profile("ci")
    impl = impls.plugin(a.impl)
    print(f"# calling contexts: {impl.id} in {a.dtype}, the ci profile ({PROFILES['ci']} examples), median of "
          f"{a.repeats}; {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'family':<10} {'fields drawn':<14} {'s':>7} {'calls':>6} {'cases':>6} {'off':>4}  outcome")
    for family, module in MODULES.items():
        timed(impl, family, dtype, (), 1)  # warm-up: imports, the first call, the oracle's C kernels
        rows = [("(pinned)", ())] + [(f, (f,)) for f in module.DRAWN] + [("(all)", module.DRAWN)]
        for label, drawn in rows:
            seconds, calls, cases, off, outcome = timed(impl, family, dtype, drawn, a.repeats)
            extra = str(off.get(label, "")) if len(drawn) == 1 else ""
            print(f"{family:<10} {label:<14} {seconds:>7.2f} {calls:>6} {cases:>6} {extra:>4}  {outcome}")


if __name__ == "__main__":
    main()
