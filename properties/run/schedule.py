"""Which scheduled cases (``search.buckets``) a family runs for a kernel and dtype in this run.

``scheduled`` gives the family's buckets, spun by the run's seed; those of ``ROTATED`` (and, for a
kernel under Triton's interpreter, ``ROTATED_INTERPRETED``) run in one dtype of the kernel's domain
(and the run's scope) per run, the dtype ``rotated`` names.  The long run (``LONG_RUN``) runs in every
dtype, its full count in the one ``rotated`` names (``long_run_calls``).
"""
from __future__ import annotations

from dataclasses import replace

from ... import oracle
from ...oracle.formats import DTYPE_NAMES
from ..harness.probes import runs_interpreted
from ..search.buckets import LONG_RUN, buckets, large_buckets


ROTATED = ("million",)
"""Buckets scheduled in one dtype of the kernel's domain per run (``rotated``): "million" (a call past
2**20 elements costs seconds under Triton's interpreter)."""
ROTATED_INTERPRETED = ("many",)
"""Buckets a kernel under Triton's interpreter runs in one dtype per run: "many", 1025 rows there
(``buckets.MANY_ROWS_INTERPRETED``), a program each for a row-per-program kernel.  In every dtype it
was about 19 s of Liger RMSNorm's 42 s interpreted certify (four families, three dtypes); its bugs,
a launch or a dispatch that changes with the row count, are the shape's rather than the dtype's, and
over seeds every dtype has it.  On a GPU every dtype runs it, at 65537 rows."""


def rotated(session, impl, family_name: str, bucket: str) -> str:
    """The dtype (its name) of the kernel's domain and the run's scope (``Session.dtypes``) that
    ``bucket`` of the family runs in (or, for the long run, makes its full count in) this run,
    rotating with the seed."""
    admitted = [d for d in DTYPE_NAMES.values()
                if impl.domain.admits_dtype(d) and (session.dtypes is None or d in session.dtypes)]
    return admitted[session.derive_seed(impl.op, family_name, bucket) % len(admitted)] if admitted else ""


def long_run_calls(session, impl, family_name: str, dtype: str) -> int:
    """The calls in a row of the family's long run in ``dtype`` (a name) this run: the run's count
    (``Session.long_run``: 2**16 for ``normcert certify``) in the dtype ``rotated`` names, at most
    ``Session.long_run_every`` (LONG_RUN_EVERY = 8193 for ``normcert certify``) in each other one
    (``families.long_run``)."""
    full = rotated(session, impl, family_name, LONG_RUN) == dtype
    return session.long_run if full else min(session.long_run, session.long_run_every)


def scheduled(session, family, impl, dtype) -> tuple:
    """The family's buckets (``buckets.buckets``) for this kernel and dtype, spun by the run's seed;
    those of ``ROTATED`` in one dtype per run, the long run making ``long_run_calls``; each told its
    turn in the schedule (``buckets.cycled``)."""
    if not family.buckets or not family.applies(oracle.OPS[impl.op]) or not impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
        return ()
    spin = session.derive_seed(impl.op, family.name, DTYPE_NAMES[dtype], "buckets")
    if family.profile == "large":
        return large_buckets(oracle.OPS[impl.op], spin)
    interpreted = ("many" in family.buckets or LONG_RUN in family.buckets) and runs_interpreted(session, impl, dtype)
    calls = long_run_calls(session, impl, family.name, DTYPE_NAMES[dtype])
    rotating = ROTATED + (ROTATED_INTERPRETED if interpreted else ())
    mine = [b for b in buckets(oracle.OPS[impl.op], spin, interpreted, calls) if b.name in family.buckets
            and (b.name not in rotating or rotated(session, impl, family.name, b.name) == DTYPE_NAMES[dtype])]
    return tuple(replace(b, turn=k, cycle=spin) for k, b in enumerate(mine))
