"""normcert's oracles: what each op *means*, forward and backward.

One record per op (``OPS``, see ``record``).  Each evaluates the op's maths exactly on the
rounded inputs the kernel saw, by one of two paths (``oracle.backends``):

    forward(op, path="float64", **args)          -> tuple of float64 arrays
    vjp(op, cotangents, path="float64", **args)  -> {input name: float64 array}

``args`` are the op's arguments by name (torch tensors, Python floats and GELU's form; for
``deep_norm`` the affine sublayer is given as ``sub_weight``/``sub_bias``).
Results are the exact values rounded once to float64, *not* rounded to the
kernel's dtype: the error model measures against the exact value.  A quantised
output (``record.Out.quantised``) is also exact *for its rounding*: rounding it
to its format gives the exactly rounded value (``_resolve``).
The maths of each op is in the docstring of its module.
"""
from __future__ import annotations

import mpmath
import numpy as np
import torch

from .backends import BACKENDS, MP_PREC
from .formats import fmt, to_float64, toward_exact
from .ops import OPS
from .kinds import KINDS
from .record import Op


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
    and converted to backend ``B``'s values by their kinds (``kinds.Kind.convert``)."""
    missing = [a.name for a in op.args if a.name not in args and not KINDS[a.kind].may_be_none]
    if missing:
        raise ValueError(f"{op.name}: missing argument(s) {', '.join(missing)}")
    op.check(args)
    n = args[op.main].shape[-1]
    return {a.name: KINDS[a.kind].convert(B, args.get(a.name), n) for a in op.args}


def _run(B, fn, *a, **kw):
    with mpmath.workprec(MP_PREC), np.errstate(all="ignore"):
        return fn(B, *a, **kw)


def forward(op: str, path: str = "float64", **args) -> tuple[np.ndarray, ...]:
    """The exact outputs of ``op`` on ``args``, rounded once to float64."""
    rec = _op(op)
    B, kw = _prepare(rec, path, args)
    outs = [_to_float64(B, rec, name, o) for name, o in zip(rec.outputs, _run(B, rec.forward, **kw))]
    outs = [fmt(rec.out_dtype(name, args)).round(o) if name in rec.rounded else o
            for name, o in zip(rec.outputs, outs)]
    if rec.quantised and B is not BACKENDS["mpmath"]:
        _resolve(rec, args, outs)
    return tuple(outs)


def _to_float64(B, rec: Op, name: str, o) -> np.ndarray:
    """``B.to_float64(o)``; for a quantised output on mpmath, a float64 value v rounded to nearest
    that lands exactly on a midpoint of the quantised format while the exact value does not is
    moved one float64 ulp towards it, so that rounding v to the format rounds the exact value."""
    v = B.to_float64(o)
    if rec.quantised_format(name) is None or B is not BACKENDS["mpmath"]:
        return v
    return toward_exact(v, lambda i: o[i], rec.quantised_format(name))


def _resolve(rec: Op, args: dict, outs: list) -> None:
    """Quantised outputs from float64: where the oracle's own error (the bound with
    ``kernel=False``) reaches past a midpoint of a quantised output's format, rounding v might not
    round the exact value; those rows are evaluated again on mpmath (a quantised op is rowwise), in
    place, every output of the row at once: a row's values and its scales come from one evaluation
    (y = v / (D g) with D the row's own rounded scale), never y from float64 beside a scale that
    mpmath rounded the other way at a tie.

    An element whose bound is -inf here is skipped: no claim even for an exact kernel (its scale is
    not a positive finite number, or its group holds an indeterminate or unclaimed-NaN element or a
    v whose own bound is infinite, ``bounds_quant``), and a kernel's bound only adds terms to the
    oracle's (``error_model.Context``: kernel=False drops them, and its range limits are +-inf), so
    that element has no claim in any check and its rounding is read by none; resolving it cost the
    quant ops' extremes cells a whole row set on mpmath (2048 rows of a float64 case, ~48 s).

    So is one whose bound is +inf (an FP4 block whose scale may round to 0: ``bounds_quant.block``'s
    s_lo = 0), for the same reason where the output is compared as it is (the kernel's bound is
    +inf or -inf there too: larger v and scale errors only lower s_lo).  Where y is held against the
    kernel's own scale s_k (``measure.oracle_assessments``: w = y S / s_k, ``rescaled``) it is
    claimed again, but the rounding of y is not what is read: w comes from y and S of one evaluation
    (consistent whichever way S rounded), its bound holds v's own error over s_k g (the oracle's
    included) and rel |w| with rel >= ORACLE, and it is 0 only where s_k = 0 (w = 0 whatever y) or on
    a row every order computes exactly (``exactly_quantised``: v, the divisor and g powers of two
    and normal, so float64's y = v / (D g) is exact).  Resolving those rows was 30.6 s of the 33.7 s
    of silu_and_mul_fp4_quant's extremes cell in bfloat16 (4,132 rows, every one for such elements)."""
    bounds = rec.forward_bound(args, tuple(outs), kernel=False)
    near_rows: set[int] = set()
    for k, name in enumerate(rec.outputs):
        if rec.quantised_format(name) is None:
            continue
        f = rec.quantised_format(name)
        v, b = outs[k], bounds[k]
        n = v.shape[-1]  # an output row (half of x's for a halves op): its rows are x's
        with np.errstate(all="ignore"):
            near = np.isfinite(v) & np.isfinite(b) & (f.round(v - b) != f.round(v + b))
        if n:
            near_rows.update(np.nonzero(near.reshape(-1, n).any(axis=1))[0].tolist())
    if not near_rows:
        return
    rows = np.array(sorted(near_rows))
    exact = forward(rec.name, path="mpmath", **row_args(rec, args, rows))
    for k, v in enumerate(outs):
        n = v.shape[-1]
        if n:
            flat = v.reshape(-1, n).copy()
            flat[rows] = exact[k].reshape(-1, n)
            outs[k] = flat.reshape(v.shape)


def row_args(rec: Op, args: dict, rows) -> dict:
    """``args`` of ``rec`` narrowed to the given rows (flattened leading dims) of its row tensors,
    as one (len(rows), n) batch, every tensor on the main tensor's device (``Op.check`` refuses a
    counts tensor elsewhere).  The rows are claimed ones, valid rows of a masked op: a selection
    of rows is one expert whose rows are all valid (counts: len(rows)); an argument that may be
    None may be left out (a contract choice not declared: ``kinds``)."""
    device = args[rec.main].device
    return {a.name: _rows(args[a.name], rows) if KINDS[a.kind].shape == "rows" else
            torch.tensor(len(rows), device=device) if KINDS[a.kind].shape == "experts" else args.get(a.name)
            for a in rec.args}


def _rows(t: torch.Tensor, rows) -> torch.Tensor:
    """The given rows (flattened leading dims) of t, as a (len(rows), n) tensor on t's device."""
    return t.reshape(-1, t.shape[-1])[torch.as_tensor(rows, device=t.device)]


def vjp(op: str, cotangents, path: str = "float64", **args) -> dict[str, np.ndarray]:
    """Exact vector-Jacobian products of ``op`` for ``cotangents`` (one per output)."""
    rec = _op(op)
    if rec.vjp is None:
        raise ValueError(f"{op}: no VJP (an inference-only op: it has no gradients)")
    B, kw = _prepare(rec, path, args)
    if len(cotangents) != len(rec.outputs):
        raise ValueError(f"{op}: cotangents must be {len(rec.outputs)} tensor(s), got {len(cotangents)}")
    cot = tuple(B.array(to_float64(c) if isinstance(c, torch.Tensor) else c) for c in cotangents)
    out = _run(B, rec.vjp, cot, **kw)
    return {k: B.to_float64(out[k]) for k in rec.grads_in(args)}
