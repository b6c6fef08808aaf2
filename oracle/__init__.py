"""normcert's oracles: what each op *means*, forward and backward.

One record per op (``OPS``).  Each evaluates the op's maths exactly on the
rounded inputs the kernel saw, by one of two paths (``oracle.backends``):

    forward(op, path="float64", **args)          -> tuple of float64 arrays
    vjp(op, cotangents, path="float64", **args)  -> {input name: float64 array}

``args`` are the op's arguments by name (torch tensors and Python floats; for
``deep_norm`` the affine sublayer is given as ``sub_weight``/``sub_bias``).
Results are the exact values rounded once to float64, *not* rounded to the
kernel's dtype: the error model measures against the exact value.
The maths of each op is in the docstring of its module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mpmath
import numpy as np
import torch

from . import batch_norm, deep_norm, layer_norm, rms_norm, swiglu
from . import validate as v
from .backends import BACKENDS, MP_PREC
from .formats import fmt, to_float64


@dataclass(frozen=True)
class OracleOp:
    name: str
    tensors: tuple[str, ...]  # tensor arguments, in call order
    scalars: tuple[str, ...]  # scalar arguments
    outputs: tuple[str, ...]
    grads: tuple[str, ...]  # inputs that get a gradient
    check: Callable[[dict], None]
    fwd: Callable
    bwd: Callable
    rounded: tuple[str, ...] = ()  # outputs defined as the exact value rounded (RNE) to x.dtype


def _check_norm(op, has_bias):
    def check(a):
        v.tensor(op, "x", a["x"])
        n = a["x"].shape[-1]
        v.vector(op, "weight", a["weight"], n, a["x"].dtype)
        if has_bias:
            v.vector(op, "bias", a["bias"], n, a["x"].dtype)
        v.positive(op, "eps", a["eps"])

    return check


def _check_add_rms(a):
    _check_norm("add_rms_norm", False)(a)
    v.same_as("add_rms_norm", "residual", a["residual"], a["x"])


def _check_batch_norm(a):
    _check_norm("batch_norm", True)(a)
    v.mask("batch_norm", a.get("mask"), a["x"])


def _check_deep_norm(a):
    _check_norm("deep_norm", True)(a)
    n = a["x"].shape[-1]
    v.square("deep_norm", "sub_weight", a["sub_weight"], n, a["x"].dtype)
    v.vector("deep_norm", "sub_bias", a["sub_bias"], n, a["x"].dtype)
    v.finite("deep_norm", "alpha", a["alpha"])


def _check_swiglu(a):
    v.tensor("swiglu", "gate", a["gate"])
    v.same_as("swiglu", "up", a["up"], a["gate"])


def _check_silu_and_mul(a):
    v.tensor("silu_and_mul", "x", a["x"])
    v.even_last_dim("silu_and_mul", a["x"])


OPS: dict[str, OracleOp] = {
    op.name: op
    for op in [
        OracleOp("rms_norm", ("x", "weight"), ("eps",), ("y",), ("x", "weight"),
                 _check_norm("rms_norm", False), rms_norm.forward, rms_norm.vjp),
        OracleOp("add_rms_norm", ("x", "residual", "weight"), ("eps",), ("y", "residual_out"),
                 ("x", "residual", "weight"), _check_add_rms, rms_norm.add_forward, rms_norm.add_vjp,
                 rounded=("residual_out",)),
        OracleOp("layer_norm", ("x", "weight", "bias"), ("eps",), ("y",), ("x", "weight", "bias"),
                 _check_norm("layer_norm", True), layer_norm.forward, layer_norm.vjp),
        OracleOp("batch_norm", ("x", "weight", "bias", "mask"), ("eps",), ("y",), ("x", "weight", "bias"),
                 _check_batch_norm, batch_norm.forward, batch_norm.vjp),
        OracleOp("deep_norm", ("x", "sub_weight", "sub_bias", "weight", "bias"), ("alpha", "eps"), ("y",),
                 ("x", "weight", "bias"), _check_deep_norm, deep_norm.forward, deep_norm.vjp),
        OracleOp("swiglu", ("gate", "up"), (), ("y",), ("gate", "up"),
                 _check_swiglu, swiglu.forward, swiglu.vjp),
        OracleOp("silu_and_mul", ("x",), (), ("y",), ("x",),
                 _check_silu_and_mul, swiglu.mul_forward, swiglu.mul_vjp),
    ]
}


def _op(name) -> OracleOp:
    if name not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {name!r}")
    return OPS[name]


def _prepare(op: OracleOp, path: str, args: dict):
    if path not in BACKENDS:
        raise ValueError(f"path must be one of {', '.join(BACKENDS)}, got {path!r}")
    missing = [k for k in op.tensors + op.scalars if k not in args and k != "mask"]
    if missing:
        raise ValueError(f"{op.name}: missing argument(s) {', '.join(missing)}")
    op.check(args)
    B = BACKENDS[path]
    kw = {}
    for k in op.tensors:
        t = args.get(k)
        if k == "mask":
            kw[k] = None if t is None else t.detach().cpu().numpy().astype(bool)
        else:
            kw[k] = B.array(to_float64(t))
    for k in op.scalars:
        kw[k] = float(args[k])
    return B, kw


def _run(B, fn, *a, **kw):
    with mpmath.workprec(MP_PREC), np.errstate(all="ignore"):
        return fn(B, *a, **kw)


def forward(op: str, path: str = "float64", **args) -> tuple[np.ndarray, ...]:
    """The exact outputs of ``op`` on ``args``, rounded once to float64."""
    rec = _op(op)
    B, kw = _prepare(rec, path, args)
    outs = [B.to_float64(o) for o in _run(B, rec.fwd, **kw)]
    dtype = args[rec.tensors[0]].dtype
    return tuple(fmt(dtype).round(o) if name in rec.rounded else o for name, o in zip(rec.outputs, outs))


def vjp(op: str, cotangents, path: str = "float64", **args) -> dict[str, np.ndarray]:
    """Exact vector-Jacobian products of ``op`` for ``cotangents`` (one per output)."""
    rec = _op(op)
    B, kw = _prepare(rec, path, args)
    if len(cotangents) != len(rec.outputs):
        raise ValueError(f"{op}: cotangents must be {len(rec.outputs)} tensor(s), got {len(cotangents)}")
    cot = tuple(B.array(to_float64(c) if isinstance(c, torch.Tensor) else c) for c in cotangents)
    out = _run(B, rec.bwd, cot, **kw)
    return {k: B.to_float64(out[k]) for k in rec.grads}
