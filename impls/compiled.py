"""torch.compile (dynamic shapes) of every eager implementation, one per op record.

On CPU this is inductor's C++ backend; on a GPU, inductor's Triton backend.
Each is importable by its op's name (``normcert.impls.compiled:rms_norm``).
"""
from __future__ import annotations

import torch

from normcert.oracle import OPS

from . import eager, make

COMPILED = {op: torch.compile(getattr(eager, op), dynamic=True) for op in OPS}

IMPLS = [make(op, "compiled", "compiled", fn, target=f"normcert.impls.compiled:{op}") for op, fn in COMPILED.items()]


def __getattr__(name: str):
    if name in COMPILED:
        return COMPILED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
