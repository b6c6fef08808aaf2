"""torch.compile (dynamic shapes) of every eager implementation, one per op record.

On CPU this is inductor's C++ backend; on a GPU, inductor's Triton backend.
Each is importable by its op's name (``normcert.impls.compiled:rms_norm``).
"""
from __future__ import annotations

import functools

import torch

from ..oracle import OPS

from . import eager, make


def compiled_at_first_call(fn, **options):
    """``torch.compile(fn, **options)``, made at the first call: ``torch.compile`` imports Dynamo and
    inductor (about 5 s), which every process that builds the registry -- each xdist worker, each
    ``normcert certify`` of a user's kernel -- would otherwise pay whether or not it calls a compiled
    kernel.  Same signature and docstring as ``fn``; the compiled function is made once."""
    made = functools.cache(lambda: torch.compile(fn, **options))

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return made()(*args, **kwargs)

    return call


COMPILED = {op: compiled_at_first_call(getattr(eager, op), dynamic=True) for op in OPS}

IMPLS = [make(op, "compiled", "compiled", fn, target=f"normcert.impls.compiled:{op}") for op, fn in COMPILED.items()]


def __getattr__(name: str):
    if name in COMPILED:
        return COMPILED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
