"""The oracle itself: its two paths agree, and bad input is refused clearly.

Cross-check: on generated inputs -- huge dynamic range, |mean| >> std,
near-constant and zero rows, subnormals, NaN / inf -- the float64-exact path
and the mpmath path agree, with NaN exactly where mp has NaN and the same
infinities, and

    forward    |f64 - mp| <= 16 u_64 * scale (see ``scale``: normwise over the
               reduced group for the norms, the element's own |mp| for SwiGLU);
    backward   |f64 - mp| <= the error model's bound for a float64 kernel on
               the same (exactly widened) inputs.  The VJP formulas subtract
               terms that can cancel completely (e.g. rms_norm's dx when dy is
               parallel to y), and the float64 path rounds those terms, so its
               promise is "as good as a correct float64 kernel", not 16 u_64
               of a result that may itself be ~0.  Where the model claims
               nothing (a row whose sum of squares overflows float64), its
               formulas overflow too, and only the NaN / inf pattern is compared;
               the forward values there are still held to 16 u_64.

The float64 path runs twice, on its native kernels and on the pure torch path
(``NORMCERT_ORACLE_NATIVE=0``, or no C compiler): both must meet these bounds.
``test_oracle_paths.py`` compares the two directly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from normcert import oracle
from normcert.oracle.formats import to_float64

from .strategies import PROFILES, cases, cotangents
from .test_accuracy import valid_positions
from .test_oracle_paths import extraction

U64 = 2.0 ** -53


def scale(op, name, mp, args):
    """The natural scale of each exact value: the float64 path's error is a few u_64 of it.

    Elementwise results (SwiGLU, the rounded residual) are their own scale.  A
    normalisation's reduction is accurate relative to its whole group (the row;
    for batch_norm the positions of a channel), and its last step, xhat w + b,
    to |xhat w| + |b|: so max over the group of |y - b|, plus |b|.
    """
    rec = oracle.OPS[op]
    finite = np.isfinite(mp)
    if rec.elementwise or name in rec.rounded or mp.ndim == 0 or mp.size == 0:
        return np.where(finite, np.abs(mp), 0.0)
    bias = to_float64(args["bias"]) if name == "y" and "bias" in args else 0.0
    with np.errstate(all="ignore"):
        mag = np.where(finite, np.abs(mp - bias), 0.0)
    mask = args.get(rec.mask) if rec.mask else None
    if mask is not None and (name in rec.outputs or name[1:] in rec.row_inputs):  # over the positions
        mag = np.where(mask.cpu().numpy()[..., None], mag, 0.0)
    group = (-1,) if rec.rowwise else tuple(range(mp.ndim - 1))
    return np.broadcast_to(mag.max(axis=group, keepdims=True), mag.shape) + np.abs(bias)


def agree(op, name, f64, mp, mag, bound=None, where=None):
    if where is not None:  # batch_norm: padded positions are not part of the op
        where = np.broadcast_to(where, mp.shape)
        f64, mp, mag = f64[where], mp[where], np.broadcast_to(mag, where.shape)[where]
        bound = None if bound is None else np.broadcast_to(bound, where.shape)[where]
    assert np.array_equal(np.isnan(f64), np.isnan(mp)), f"{op} {name}: NaN pattern differs"
    inf = np.isinf(mp)
    assert np.array_equal(f64[inf], mp[inf]), f"{op} {name}: infinities differ"
    fin = np.isfinite(mp)
    with np.errstate(all="ignore"):
        err = np.where(fin, np.abs(f64 - mp), 0.0)
    tiny = 16 * 2.0 ** -1074  # 16 units of float64's subnormal spacing
    tol = 16 * U64 * mag + tiny
    bad = err > (tol if bound is None else bound)  # bound = inf: outside every kernel's domain, pattern only
    assert not bad.any(), (f"{op} {name}: float64 path off by {err[bad].max():.3g} "
                           f"({(err[bad] / (U64 * mag[bad] + tiny)).max():.3g} u64 of the scale)")


@pytest.mark.parametrize("kernels", ["native", "pure"])
@pytest.mark.parametrize("op", list(oracle.OPS))
@settings()  # the profile decides: 12 examples in ci, 300 in thorough
@given(data=st.data())
def test_paths_agree(op, dtype, kernels, data):
    with extraction(kernels):
        _paths_agree(op, dtype, data)


def _paths_agree(op, dtype, data):
    case = data.draw(cases(op, dtype, "cpu", profiles=PROFILES, hostile=True, max_elems=96, max_n=24))
    args = case.oracle_args()
    f64 = oracle.forward(op, path="float64", **args)
    mp = oracle.forward(op, path="mpmath", **args)
    where = valid_positions(case)
    for name, a, b in zip(oracle.OPS[op].outputs, f64, mp):
        agree(op, name, a, b, scale(op, name, b, args), where=where)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    cot = cotangents(rng, [(o.shape, dtype) for o in f64], "cpu")
    g64 = oracle.vjp(op, cot, path="float64", **args)
    gmp = oracle.vjp(op, cot, path="mpmath", **args)
    wide = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in args.items()}
    bounds = oracle.OPS[op].grad_bound(wide, tuple(c.double() for c in cot), gmp)
    for k in g64:
        agree(op, "d" + k, g64[k], gmp[k], scale(op, "d" + k, gmp[k], args), bounds[k], where=where if k == "x" else None)


def test_exact_reduction_is_exact():
    """A sum that cancels to one ulp of its terms: naive float64 gives 0, the oracle the exact value."""
    x = torch.tensor([[1e16, 1.0, -1e16, 1.0, 3.0 * 2 ** -40]], dtype=torch.float64)
    (y,) = oracle.forward("layer_norm", x=x, weight=torch.ones(5, dtype=torch.float64),
                          bias=torch.zeros(5, dtype=torch.float64), eps=1e-300)
    (ymp,) = oracle.forward("layer_norm", path="mpmath", x=x, weight=torch.ones(5, dtype=torch.float64),
                            bias=torch.zeros(5, dtype=torch.float64), eps=1e-300)
    assert np.allclose(y, ymp, rtol=4 * U64, atol=0)


@pytest.mark.parametrize("x, r, rounded", [
    (1.0, 2.0 ** -8 + 2.0 ** -15, 1.0 + 2.0 ** -7),  # above the midpoint: up
    (1.0, 2.0 ** -8, 1.0),  # a tie: to even (down)
    (1.0 + 2.0 ** -7, 2.0 ** -8, 1.0 + 2.0 ** -6),  # a tie: to even (up)
    (1.0, -(2.0 ** -9 + 2.0 ** -16), 1.0 - 2.0 ** -8),  # below 1 the spacing halves; below the midpoint: down
])
def test_residual_is_correctly_rounded(x, r, rounded):
    """bf16 residual_out = RNE(x + r), with x and r themselves bf16 values."""
    xt, rt = torch.tensor([[x]], dtype=torch.bfloat16), torch.tensor([[r]], dtype=torch.bfloat16)
    assert (xt.item(), rt.item()) == (x, r), "the test's inputs must be exact bfloat16 values"
    _, res = oracle.forward("add_rms_norm", x=xt, residual=rt, weight=torch.ones(1, dtype=torch.bfloat16), eps=1e-6)
    assert res[0, 0] == rounded


def _ok_args():
    x = torch.zeros(2, 4)
    return dict(x=x, weight=torch.ones(4), bias=torch.zeros(4), eps=1e-5)


@pytest.mark.parametrize("change, message", [
    (dict(weight=torch.ones(3)), "weight must be of shape (4,)"),
    (dict(x=torch.zeros(2, 4, dtype=torch.int32)), "x must be of dtype"),
    (dict(eps=0.0), "eps must be a positive finite float"),
    (dict(eps=-1e-5), "eps must be a positive finite float"),
    (dict(eps=math.nan), "eps must be a positive finite float"),
    (dict(weight=torch.ones(4, dtype=torch.float16)), "weight must be of dtype"),
    (dict(mask=torch.ones(3, dtype=torch.bool)), "mask must be of shape (2,)"),
    (dict(mask=torch.ones(2)), "mask must be a bool tensor"),
])
def test_bad_input_is_a_clear_value_error(change, message):
    with pytest.raises(ValueError, match=f"^batch_norm: {message.replace('(', '[(]').replace(')', '[)]')}"):
        oracle.forward("batch_norm", **{**_ok_args(), **change})


def test_bad_op_and_path():
    with pytest.raises(ValueError, match="op must be one of"):
        oracle.forward("softmax", x=torch.zeros(2))
    with pytest.raises(ValueError, match="path must be one of"):
        oracle.forward("rms_norm", path="float128", x=torch.zeros(2, 4), weight=torch.ones(4), eps=1e-5)
    with pytest.raises(ValueError, match="last dim is even"):
        oracle.forward("silu_and_mul", x=torch.zeros(2, 3))
