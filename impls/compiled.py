"""torch.compile (dynamic shapes) of every eager implementation.

On CPU this is inductor's C++ backend; on a GPU, inductor's Triton backend.
"""
from __future__ import annotations

import torch

from . import eager, make

rms_norm = torch.compile(eager.rms_norm, dynamic=True)
add_rms_norm = torch.compile(eager.add_rms_norm, dynamic=True)
layer_norm = torch.compile(eager.layer_norm, dynamic=True)
batch_norm = torch.compile(eager.batch_norm, dynamic=True)
deep_norm = torch.compile(eager.deep_norm, dynamic=True)
swiglu = torch.compile(eager.swiglu, dynamic=True)
silu_and_mul = torch.compile(eager.silu_and_mul, dynamic=True)

IMPLS = [
    make(op, "compiled", "compiled", globals()[op], target=f"normcert.impls.compiled:{op}")
    for op in ("rms_norm", "add_rms_norm", "layer_norm", "batch_norm", "deep_norm", "swiglu", "silu_and_mul")
]
