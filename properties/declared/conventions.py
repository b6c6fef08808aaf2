"""Calling conventions: kernels that write into the caller's buffers, called under the contract.

The contract (docs/reference/op-contracts.md) is out of place: ``y = fn(*inputs)``.  Real kernels also
write into buffers they are handed and return nothing.  A plug-in declares its
convention as ``--impl OP=MODULE:ATTR@CONVENTION``:

    inplace   fn(x!, residual!, ...) -> None: output k written into the op's k-th
              rows input (add_rms_norm: y into x, residual_out into residual;
              vLLM fused_add_rms_norm, FlashInfer fused_add_rmsnorm)
    out       fn(out!, *inputs) -> None: the outputs preallocated, first positional
              (vLLM rms_norm(out, input, weight, eps), silu_and_mul(out, x))
    outkw     fn(*inputs, out=out!) -> None or out: written into ``out=`` (a tuple
              for an op with several outputs; FlashInfer rmsnorm(input, weight, eps, out=...))

``adapt`` wraps such a kernel into the contract, so every property calls it the
same way, and checks what the convention promises:

* the buffers it hands over are fresh and filled with ``POISON`` (a NaN with a
  payload no arithmetic produces, for each dtype): an element still holding
  that pattern after the call was never written, a ``ConventionViolation``;
* for ``inplace``, the inputs it mutates are copies with the case's own strides,
  offset and whole storage (the case's tensors stay untouched), and a write
  anywhere in that storage outside the view is a ``ConventionViolation``; the
  storage around a view the suite makes holds ``POISON`` too
  (``strategies.surround``), so that a write there, zeros included, changes
  bits; any other input it writes is caught by the contract property like any
  kernel's;
* it returns what the convention says: None (``outkw``: None or ``out`` itself).

The mutated copies are detached: an in-place kernel has no autograd graph
through its outputs unless its own writes record one.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...oracle.formats import bits

CONVENTIONS = ("inplace", "out", "outkw")

#: the bits of an unwritten element: a quiet NaN whose payload is not the canonical one
POISON = {torch.float64: 0x7FF8_0000_DEAD_BEEF, torch.float32: 0x7FC0_BEEF,
          torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}


class ConventionViolation(Exception):
    """The kernel broke its declared convention (one line, naming what)."""


def split(target: str) -> tuple[str, str]:
    """``MODULE:ATTR@CONVENTION`` -> (``MODULE:ATTR``, convention or ""), unchecked (``check``)."""
    base, sep, convention = target.rpartition("@")
    return (base, convention) if sep else (target, "")


def check(convention: str, op) -> None:
    """ValueError unless ``convention`` is "" or one of ``CONVENTIONS`` and ``op`` (an
    ``oracle.Op``) can be called with it."""
    if convention and convention not in CONVENTIONS:
        raise ValueError(f"convention {convention!r}: expected one of {', '.join(CONVENTIONS)}")
    if convention == "inplace":
        rows = op.row_inputs
        if op.halves or len(op.outputs) > len(rows):
            raise ValueError(f"@inplace: {op.name}'s outputs ({', '.join(op.outputs)}) do not each have an input "
                             f"of their own shape to be written into")
        own = [o for o in op.outs if o.dtype is not None]
        if own:
            raise ValueError(f"@inplace: {op.name}'s {', '.join(o.name for o in own)} has a dtype of its own "
                             f"({', '.join(str(o.dtype).replace('torch.', '') for o in own)}), not its input's: "
                             f"use @out or @outkw")


def poisoned(shape, dtype, device) -> torch.Tensor:
    """A fresh contiguous tensor whose every element holds ``POISON`` (zeros for a dtype without one)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if dtype in POISON:
        bits(t).fill_(_signed(POISON[dtype], torch.finfo(dtype).bits))
    else:
        t.zero_()
    return t


def _signed(bits: int, width: int) -> int:
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def unwritten(t: torch.Tensor) -> int:
    """How many elements of ``t`` still hold ``POISON``."""
    if t.dtype not in POISON:
        return 0
    pattern = _signed(POISON[t.dtype], torch.finfo(t.dtype).bits)
    return int((bits(t.detach()) == pattern).sum())


def _like(x: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``x`` with x's own sizes, strides and offset in a copy of its whole storage
    (the q and v around the k part of a fused QKV buffer too); contiguous where x overlaps itself."""
    x = x.detach()
    overlapping = any(st == 0 and sz > 1 for sz, st in zip(x.shape, x.stride()))
    if overlapping or x.numel() == 0:
        return x.clone(memory_format=torch.contiguous_format)
    return _view(x, x.untyped_storage().clone())


def _view(x: torch.Tensor, storage) -> torch.Tensor:
    """x's view (sizes, strides, offset) of another storage."""
    return torch.empty(0, dtype=x.dtype, device=x.device).set_(storage, x.storage_offset(), x.shape, x.stride())


def written_outside(x: torch.Tensor, buf: torch.Tensor) -> int:
    """How many bytes of ``buf``'s storage outside its view differ from ``x``'s (``buf = _like(x)``
    after the kernel wrote into it): writes the convention does not allow."""
    if buf.untyped_storage().nbytes() != x.untyped_storage().nbytes():
        return 0  # a contiguous copy of an overlapping view: nothing around it was handed over
    expected = x.untyped_storage().clone()
    _view(x, expected).copy_(buf)  # the caller's storage with the view's new values
    as_bytes = lambda st: torch.empty(0, dtype=torch.uint8, device=x.device).set_(st)  # noqa: E731
    return int((as_bytes(expected) != as_bytes(buf.untyped_storage())).sum())


def adapt(convention: str, op, fn: Callable) -> Callable:
    """``fn`` under ``convention``, as a callable with the out-of-place contract of ``op``.

    The contract's calls lead with the op's rows inputs (x; x, residual; gate, up), so
    ``inplace`` writes output k into positional argument k."""
    if not convention:
        return fn

    def contract(*args, **kwargs):
        main = args[0]
        if convention == "inplace":
            bufs = [_like(a) for a in args[:len(op.outputs)]]
            _returns(fn(*bufs, *args[len(bufs):], **kwargs), None, convention)
            for name, a, buf in zip(op.row_inputs, args, bufs):
                n = written_outside(a, buf)
                if n:
                    raise ConventionViolation(f"@inplace: {n} bytes of {name}'s storage outside its view were "
                                              f"written (the caller's data around the view)")
        else:
            named = dict(zip((a.name for a in op.args), args))  # in call order: a row input, a qdtype
            bufs = [poisoned(shape, op.out_dtype(name, named), main.device)
                    for name, shape in zip(op.outputs, op.out_shapes(tuple(main.shape), named))]
            if convention == "out":
                _returns(fn(*bufs, *args, **kwargs), None, convention)
            else:
                out = bufs[0] if len(bufs) == 1 else tuple(bufs)
                _returns(fn(*args, out=out, **kwargs), out, convention)
            for name, buf in zip(op.outputs, bufs):
                n = unwritten(buf)
                if n:
                    raise ConventionViolation(f"@{convention}: {n} of {buf.numel()} elements of {name} "
                                              f"were never written")
        return bufs[0] if len(bufs) == 1 else tuple(bufs)

    contract.__name__ = getattr(fn, "__name__", "kernel")
    return contract


def _returns(returned, out, convention: str) -> None:
    if returned is None or (out is not None and returned is out):
        return
    expected = "None" if out is None else "None or out itself"
    raise ConventionViolation(f"@{convention}: returned {type(returned).__name__}, expected {expected}")
