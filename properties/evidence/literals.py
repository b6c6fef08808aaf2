"""A small case's tensors as Python source a maintainer pastes into a bug report (``reproducer``).

``source(t)`` is an expression of ``torch`` and ``device`` alone that builds ``t`` bit for bit: its
dtype, shape, strides, storage offset and every element's bits.  Each floating-point element is
written as the shortest decimal of at most ``DIGITS[dtype]`` significant digits that reads back as
exactly its bits the way ``torch.tensor`` reads a Python float (the decimal to the nearest float64,
then to the nearest value of the dtype: two roundings, hence the check, not a digit count alone);
where no such decimal exists, ``float.fromhex`` of its value, exact in float64 and so in the dtype.
Infinities are ``math.inf``; a NaN is ``math.nan`` where the dtype's conversion of it gives the
stored bits, else the tensor has no literal (None): a NaN payload is kept by the archive form only.

A contiguous tensor at offset 0 is a nested list; any other layout is its storage span (the
elements from offset 0 to the last one any index reaches) as a flat list, viewed with
``as_strided``.  ``LITERAL_ELEMENTS`` bounds the elements a case may hold to be written so.
"""
from __future__ import annotations

import math

import torch

LITERAL_ELEMENTS = 256
"""A case whose tensors' storage spans hold at most this many elements in all is written as literals."""

DIGITS = {torch.float64: 17, torch.float32: 9, torch.float16: 5, torch.bfloat16: 4}
"""Significant digits enough for a decimal to name any value of the dtype (read straight into it)."""

INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def span(t: torch.Tensor) -> int:
    """How many storage elements ``t`` reaches from offset 0 (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return t.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def source(t: torch.Tensor | None) -> str | None:
    """Source that builds ``t`` bit for bit (module docstring), "None" for None; None where it has no
    literal (a dtype other than ``DIGITS``' or ``INTEGERS``, a NaN payload, a negative stride)."""
    if t is None:
        return "None"
    if t.dtype not in DIGITS and t.dtype not in INTEGERS or any(s < 0 for s in t.stride()):
        return None
    t = t.detach().cpu()
    plain = t.is_contiguous() and t.storage_offset() == 0
    flat = t.reshape(-1) if plain else torch.as_strided(t, (span(t),), (1,), 0)
    words = _words(flat)
    if words is None:
        return None
    dtype = f"dtype=torch.{str(t.dtype).removeprefix('torch.')}, device=device"
    if t.numel() == 0:
        return f"torch.empty({list(t.shape)}, {dtype})"
    if plain:
        return f"torch.tensor({_nested(words, list(t.shape))}, {dtype})"
    return (f"torch.tensor([{', '.join(words)}], {dtype})"
            f".as_strided({list(t.shape)}, {list(t.stride())}, {t.storage_offset()})")


def _nested(words: list[str], shape: list[int]) -> str:
    if not shape:
        return words[0]
    if len(shape) == 1:
        return "[" + ", ".join(words) + "]"
    step = len(words) // shape[0]
    return "[" + ", ".join(_nested(words[k * step:(k + 1) * step], shape[1:]) for k in range(shape[0])) + "]"


def _words(flat: torch.Tensor) -> list[str] | None:
    """Each element of the 1-D ``flat`` as source, or None where one has none."""
    if flat.dtype in INTEGERS:
        return [repr(bool(v)) if flat.dtype == torch.bool else str(int(v)) for v in flat.tolist()]
    bits = _bits(flat)
    values = flat.double().tolist()
    words: list[str | None] = [None] * len(values)
    for k, v in enumerate(values):
        if math.isnan(v):
            words[k] = "math.nan" if _read([math.nan], flat.dtype)[0] == bits[k] else None
            if words[k] is None:
                return None
        elif math.isinf(v):
            words[k] = "math.inf" if v > 0 else "-math.inf"
    for digits in range(1, DIGITS[flat.dtype] + 1):  # the shortest decimal that reads back as the bits
        todo = [k for k, w in enumerate(words) if w is None]
        if not todo:
            break
        texts = [repr(float(f"{values[k]:.{digits}g}")) for k in todo]  # Python's own spelling of it
        for k, text, got in zip(todo, texts, _read([float(s) for s in texts], flat.dtype)):
            if got == bits[k]:
                words[k] = text
    return [w if w is not None else f"float.fromhex({values[k].hex()!r})" for k, w in enumerate(words)]


def _read(values: list[float], dtype) -> list[int]:
    """The bits ``torch.tensor`` gives ``values`` in ``dtype``."""
    return _bits(torch.tensor(values, dtype=dtype))


def _bits(t: torch.Tensor) -> list[int]:
    as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    return t.contiguous().view(as_int).tolist()
