"""Which scheduled cases (``search.buckets``) a family runs for a kernel and dtype in this run.

``scheduled`` gives the family's buckets, spun by the run's seed; those of ``ROTATED`` run in one
dtype of the kernel's domain per run, the dtype ``rotated`` names.
"""
from __future__ import annotations

from dataclasses import replace

from ... import oracle
from ...oracle.formats import DTYPE_NAMES
from ..harness.probes import runs_interpreted
from ..search.buckets import LONG_RUN, buckets, large_buckets


ROTATED = ("million", LONG_RUN)
"""Buckets scheduled in one dtype of the kernel's domain per run (``rotated``): "million" (a call past
2**20 elements costs seconds under Triton's interpreter) and "long_run" (2**16 calls cost seconds
for an eager kernel; a state kept across calls of every dtype shows in whichever runs)."""


def rotated(session, impl, family_name: str, bucket: str) -> str:
    """The dtype (its name) of the kernel's domain that ``bucket`` of the family runs in this run,
    rotating with the seed."""
    admitted = [d for d in DTYPE_NAMES.values() if impl.domain.admits_dtype(d)]
    return admitted[session.derive_seed(impl.op, family_name, bucket) % len(admitted)] if admitted else ""


def scheduled(session, family, impl, dtype) -> tuple:
    """The family's buckets (``buckets.buckets``) for this kernel and dtype, spun by the run's seed;
    those of ``ROTATED`` in one dtype per run; each told its turn in the schedule (``buckets.cycled``)."""
    if not family.buckets or not family.applies(oracle.OPS[impl.op]) or not impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
        return ()
    spin = session.derive_seed(impl.op, family.name, DTYPE_NAMES[dtype], "buckets")
    if family.profile == "large":
        return large_buckets(oracle.OPS[impl.op], spin)
    interpreted = ("many" in family.buckets or LONG_RUN in family.buckets) and runs_interpreted(session, impl, dtype)
    mine = [b for b in buckets(oracle.OPS[impl.op], spin, interpreted, session.long_run) if b.name in family.buckets
            and (b.name not in ROTATED or rotated(session, impl, family.name, b.name) == DTYPE_NAMES[dtype])]
    return tuple(replace(b, turn=k, cycle=spin) for k, b in enumerate(mine))
