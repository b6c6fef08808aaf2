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

DOMAIN = "contiguous=all ranks=2 weightless=no params=same residual=same"
"""The registry's compiled kernels are checked on contiguous rank-2 tensors, weights given and in
x's dtype, a residual stream in x's: every other signature (a rank, a stride pattern, a None weight,
a float32 weight) is one more compilation, since every call runs compiled code
(``properties.harness.sandbox.RECOMPILE_LIMIT``); the eager kernels they compile are checked on all of them."""

DEVICES = ("cuda",)
"""Registered for GPU runs only.  Checked honestly, a compiled kernel costs one compilation per
signature its cases show (dtype, grad mode, a size of 0 or 1, ...): on the 2-core CPU machine
rms_norm's took 92 compilations and 49 s under ``DOMAIN`` and the 16 ops' float32 cases alone 211 s
of the default run, which had counted on 87 s for all of them because past Dynamo's 8th
recompilation they ran *eagerly*.  On CPU ``normcert certify --impl rms_norm=normcert.impls.compiled:rms_norm``
checks one (inductor's C++ code: its GeGLU is rejected there, see docs/explanation/findings.md)."""

QUANTISED_DOMAIN = DOMAIN + " dtypes=float32,float16,bfloat16"
"""An op with a quantised output is not compiled for float64 inputs: inductor's Triton
backend cannot lower float64 -> float8_e4m3fn (on the H100, torch 2.11, Triton 3.6: "Unsupported
conversion from f64 to f8E4M3FN with rounding mode rtne", an InductorError at every float64 call of
rms_norm_fp8, add_rms_norm_fp8 and add_rms_norm_group_quant).  float64 -> int8 compiles, but a
domain names dtypes, not (dtype, qdtype) pairs, so float64 is outside it for every quantised op;
the eager kernels take float64."""


def domain(op: str) -> str:
    """The compiled kernel's declared domain: ``QUANTISED_DOMAIN`` where an output is quantised, and
    tail=none for a per-group op (said, not left to the default): the eager code it compiles takes a
    partial tail (``eager.quantise_groups``), but under tail=partial every row length drawn would be
    one more compilation, and the compiled code is not checked on one."""
    base = QUANTISED_DOMAIN if any(o.quantised for o in OPS[op].outs) else DOMAIN
    return base + (" tail=none" if any(a.kind == "tail" for a in OPS[op].args) else "")


IMPLS = [make(op, "compiled", "compiled", fn, target=f"normcert.impls.compiled:{op}", domain=domain(op),
              devices=DEVICES) for op, fn in COMPILED.items()]


def __getattr__(name: str):
    if name in COMPILED:
        return COMPILED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
