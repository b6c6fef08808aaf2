"""normcert's oracles: what each op *means*, forward and backward.

One record per op (``OPS``, see ``record``).  Each evaluates the op's maths exactly on the
rounded inputs the kernel saw, by one of two paths (``oracle.backends``):

    forward(op, path="float64", **args)          -> tuple of float64 arrays
    vjp(op, cotangents, path="float64", **args)  -> {input name: float64 array}

``args`` are the op's arguments by name (torch tensors, Python floats and GELU's form; for
``deep_norm`` the affine sublayer is given as ``sub_weight``/``sub_bias``).
Results are the exact values rounded once to float64, *not* rounded to the
kernel's dtype: the error model measures against the exact value.
The maths of each op is in the docstring of its module.
"""
from __future__ import annotations

import mpmath
import numpy as np
import torch

from .backends import BACKENDS, MP_PREC
from .formats import fmt, to_float64
from .ops import OPS
from .record import IDENTITY, TENSOR_KINDS, Op


def _op(name) -> Op:
    if name not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {name!r}")
    return OPS[name]


def _prepare(op: Op, path: str, args: dict):
    if path not in BACKENDS:
        raise ValueError(f"path must be one of {', '.join(BACKENDS)}, got {path!r}")
    B = BACKENDS[path]
    return B, arguments(op, B, args)


def arguments(op: Op, B, args: dict) -> dict:
    """``args`` (torch tensors and Python floats, by name) validated against ``op``'s signature
    and converted to backend ``B``'s values: tensors exactly widened, the mask as numpy bools, an
    optional weight or bias given as None as its identity (ones, zeros)."""
    missing = [k for k in op.tensors + op.scalars if k not in args and k != op.mask]
    if missing:
        raise ValueError(f"{op.name}: missing argument(s) {', '.join(missing)}")
    op.check(args)
    kw = {}
    n = args[op.main].shape[-1]
    for a in op.args:
        k, t = a.name, args.get(a.name)
        if k == op.mask:
            kw[k] = None if t is None else t.detach().cpu().numpy().astype(bool)
        elif a.optional and t is None:
            kw[k] = B.array(np.full(n, IDENTITY[a.kind]))
        elif a.kind in TENSOR_KINDS:
            kw[k] = B.array(to_float64(t))
        else:
            kw[k] = t if a.kind == "approximate" else float(t)
    return kw


def _run(B, fn, *a, **kw):
    with mpmath.workprec(MP_PREC), np.errstate(all="ignore"):
        return fn(B, *a, **kw)


def forward(op: str, path: str = "float64", **args) -> tuple[np.ndarray, ...]:
    """The exact outputs of ``op`` on ``args``, rounded once to float64."""
    rec = _op(op)
    B, kw = _prepare(rec, path, args)
    outs = [B.to_float64(o) for o in _run(B, rec.forward, **kw)]
    dtype = args[rec.main].dtype
    return tuple(fmt(dtype).round(o) if name in rec.rounded else o for name, o in zip(rec.outputs, outs))


def vjp(op: str, cotangents, path: str = "float64", **args) -> dict[str, np.ndarray]:
    """Exact vector-Jacobian products of ``op`` for ``cotangents`` (one per output)."""
    rec = _op(op)
    B, kw = _prepare(rec, path, args)
    if len(cotangents) != len(rec.outputs):
        raise ValueError(f"{op}: cotangents must be {len(rec.outputs)} tensor(s), got {len(cotangents)}")
    cot = tuple(B.array(to_float64(c) if isinstance(c, torch.Tensor) else c) for c in cotangents)
    out = _run(B, rec.vjp, cot, **kw)
    return {k: B.to_float64(out[k]) for k in rec.grads_in(args)}
