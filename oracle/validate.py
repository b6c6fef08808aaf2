"""Argument checks shared by the oracle and the suite.

Every check raises ``ValueError`` whose message names the op, the argument and
what was expected, e.g.
``rms_norm: weight must have shape (4096,) (the last dim of x), got (4095,)``.
"""
from __future__ import annotations

import math
from numbers import Real

import torch

from .formats import DTYPES


def _fail(op, name, expected, got):
    got = str(got)
    raise ValueError(f"{op}: {name} must be {expected}, got {got if len(got) <= 40 else got[:37] + '...'}")


def tensor(op, name, t, dtypes=DTYPES, min_dim=1):
    if not isinstance(t, torch.Tensor):
        _fail(op, name, "a torch.Tensor", type(t).__name__)
    if t.dtype not in dtypes:
        _fail(op, name, "of dtype " + " or ".join(str(d).replace("torch.", "") for d in dtypes), t.dtype)
    if t.dim() < min_dim:
        _fail(op, name, f"a tensor of rank >= {min_dim}", f"rank {t.dim()}")


def vector(op, name, t, n, x_dtype):
    tensor(op, name, t, dtypes=tuple({x_dtype, torch.float32}))
    if tuple(t.shape) != (n,):
        _fail(op, name, f"of shape ({n},) (the last dim of x)", tuple(t.shape))


def stream_dtypes(x_dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """The dtypes a residual stream beside an x of ``x_dtype`` may have (``kinds``' "stream"): x's,
    then, for a float16 / bfloat16 x, float32."""
    return (x_dtype, torch.float32) if x_dtype in (torch.float16, torch.bfloat16) else (x_dtype,)


def stream(op, name, t, x):
    """A residual stream: x's shape, in one of ``stream_dtypes(x.dtype)``."""
    tensor(op, name, t, dtypes=stream_dtypes(x.dtype))
    if t.shape != x.shape:
        _fail(op, name, f"of shape {tuple(x.shape)} (the shape of x)", tuple(t.shape))


def same_as(op, name, t, x):
    tensor(op, name, t, dtypes=(x.dtype,))
    if t.shape != x.shape:
        _fail(op, name, f"of shape {tuple(x.shape)} (the shape of x)", tuple(t.shape))


def finite_number(v) -> bool:
    """Is ``v`` a real number (not a bool) with a finite float value?  An integer past float's
    range (10**400) is not, and asking does not raise OverflowError."""
    if isinstance(v, bool) or not isinstance(v, Real):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def positive(op, name, v):
    if not finite_number(v) or v <= 0:
        _fail(op, name, "a positive finite float", repr(v))


def finite(op, name, v):
    if not finite_number(v):
        _fail(op, name, "a finite float", repr(v))


def mask(op, m, x):
    if m is None:
        return
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        _fail(op, "mask", "a bool tensor or None", getattr(m, "dtype", type(m).__name__))
    if tuple(m.shape) != tuple(x.shape[:-1]):
        _fail(op, "mask", f"of shape {tuple(x.shape[:-1])} (x.shape[:-1])", tuple(m.shape))


def counts(op, name, c, x):
    """An integer tensor of shape x.shape[:-2] (one count per expert of an (experts..., tokens, n) x),
    on x's device, each count in [0, tokens]: expert e's first counts[e] rows are its tokens."""
    if not isinstance(c, torch.Tensor) or c.dtype not in (torch.int32, torch.int64):
        _fail(op, name, "an int32 or int64 tensor", getattr(c, "dtype", type(c).__name__))
    if x.dim() < 2:
        _fail(op, "x", "a tensor of rank >= 2 (experts..., tokens, n)", f"rank {x.dim()}")
    if tuple(c.shape) != tuple(x.shape[:-2]):
        _fail(op, name, f"of shape {tuple(x.shape[:-2])} (x.shape[:-2], one per expert)", tuple(c.shape))
    if c.device != x.device:
        _fail(op, name, f"on x's device {x.device}", c.device)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) > x.shape[-2]):
        _fail(op, name, f"each in [0, {x.shape[-2]}] (x's tokens per expert)", c.tolist())


def even_last_dim(op, x):
    if x.shape[-1] % 2:
        _fail(op, "x", "a tensor whose last dim is even (gate | up)", f"last dim {x.shape[-1]}")


def square(op, name, t, n, x_dtype):
    tensor(op, name, t, dtypes=(x_dtype,))
    if tuple(t.shape) != (n, n):
        _fail(op, name, f"of shape ({n}, {n})", tuple(t.shape))


def expected(op, name, what, got):
    """The one-line ValueError of an argument that is not ``what``."""
    _fail(op, name, what, got)


def one_of(op, name, v, choices):
    if not isinstance(v, str) or v not in choices:
        _fail(op, name, "one of " + ", ".join(repr(c) for c in choices), repr(v))


def boolean(op, name, v):
    if not isinstance(v, bool):
        _fail(op, name, "True or False", repr(v))


def group_size(op, name, v, n):
    """A positive integer that divides the row length n (a quantisation group of consecutive elements)."""
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        _fail(op, name, "a positive integer", repr(v))
    if n is not None and n % v:  # n None: a replay file's scalars, checked before its tensors load
        _fail(op, name, f"a divisor of the row length {n}", v)


def block_format(op, name, v, n, formats):
    """One of ``formats`` (name -> a format with a ``block``), whose block divides the row length n
    (n None: a replay file's scalars, checked before its tensors load)."""
    one_of(op, name, v, tuple(formats))
    if n is not None and n % formats[v].block:
        _fail(op, name, f"a format whose block divides the row length {n}", f"{v!r} (block {formats[v].block})")
