"""The oracle itself: its two paths agree, and bad input is refused clearly.

Cross-check: on generated inputs -- huge dynamic range, |mean| >> std,
near-constant and zero rows, subnormals, NaN / inf -- the float64-exact path
and the mpmath path agree, with NaN exactly where mp has NaN and the same
infinities, and

    forward    |f64 - mp| <= the error model's term for the oracle's own error
               (``forward_bound(..., kernel=False)``: ORACLE = 8 u_64 of each
               result's natural scale, see ``oracle.error_model``), so this
               test is what justifies the term every bound adds;
    backward   |f64 - mp| <= the error model's bound for a float64 kernel on
               the same (exactly widened) inputs.  The VJP formulas subtract
               terms that can cancel completely (e.g. rms_norm's dx when dy is
               parallel to y), and the float64 path rounds those terms, so its
               promise is "as good as a correct float64 kernel", not 8 u_64
               of a result that may itself be ~0.  Where the model claims
               nothing (a row whose sum of squares overflows float64), its
               formulas overflow too, and only the NaN / inf pattern is compared.

The float64 path runs twice, on its native kernels and on the pure torch path
(``NORMCERT_ORACLE_NATIVE=0``, or no C compiler): both must meet these bounds.
``test_oracle_paths.py`` compares the two directly.
"""
from __future__ import annotations

import math
import re

import mpmath

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ... import oracle
from ...impls import eager
from ...impls.eager import deep_norm
from ...oracle import geglu, special, swiglu
from ...oracle.deep_norm import affine_sublayer
from ...oracle.assessment import assess
from ...oracle.bounds_norms import moved_rho
from ...oracle.bounds_quant import rescaled
from ...oracle.float64_backend import F64
from ...oracle.mpmath_backend import MP
from ...oracle.error_model import LAM_64, ORACLE, lowest_bit
from ...oracle.formats import E4M3, fmt

from ..search.case import valid_positions
from .extraction import extraction
from ..search.strategies import PROFILES, cases, cotangents


def agree(op, name, f64, mp, bound, where=None):
    bound = np.broadcast_to(bound, mp.shape)
    claimed = bound != -np.inf  # -inf: no claim at all, whatever the exact value (``assess``)
    if where is not None:  # batch_norm: padded positions are not part of the op
        claimed = claimed & np.broadcast_to(where, mp.shape)
    f64, mp, bound = f64[claimed], mp[claimed], bound[claimed]
    assert np.array_equal(np.isnan(f64), np.isnan(mp)), f"{op} {name}: NaN pattern differs"
    inf = np.isinf(mp)
    assert np.array_equal(f64[inf], mp[inf]), f"{op} {name}: infinities differ"
    fin = np.isfinite(mp)
    with np.errstate(all="ignore"):
        err = np.where(fin, np.abs(f64 - mp), 0.0)
    bad = err > bound  # bound = inf: outside the model's claim, NaN / inf pattern only
    assert not bad.any(), (f"{op} {name}: float64 path off by {err[bad].max():.3g}, "
                           f"{(err[bad] / bound[bad]).max():.3g} times the bound")


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
    rec = oracle.OPS[op]
    for name, a, b, bound in zip(rec.outputs, f64, mp, rec.forward_bound(args, mp, kernel=False)):
        agree(op, name, a, b, bound, where=where)
        if rec.quantised_format(name) is not None:  # and both round to the same, the exactly rounded, value
            f = rec.quantised_format(name)
            assert np.array_equal(f.round(a), f.round(b), equal_nan=True), f"{op} {name}: rounded values differ"
    if not rec.grads:
        return
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    cot = cotangents(rng, [(o.shape, dtype) for o in f64], "cpu")
    g64 = oracle.vjp(op, cot, path="float64", **args)
    gmp = oracle.vjp(op, cot, path="mpmath", **args)
    wide = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in args.items()}
    bounds = rec.grad_bound(wide, tuple(c.double() for c in cot), gmp)
    for k in g64:
        agree(op, "d" + k, g64[k], gmp[k], bounds[k], where=where if k == "x" else None)


def test_exact_reduction_is_exact():
    """A sum that cancels to one ulp of its terms: naive float64 gives 0, the oracle the exact value."""
    x = torch.tensor([[1e16, 1.0, -1e16, 1.0, 3.0 * 2 ** -40]], dtype=torch.float64)
    (y,) = oracle.forward("layer_norm", x=x, weight=torch.ones(5, dtype=torch.float64),
                          bias=torch.zeros(5, dtype=torch.float64), eps=1e-300)
    (ymp,) = oracle.forward("layer_norm", path="mpmath", x=x, weight=torch.ones(5, dtype=torch.float64),
                            bias=torch.zeros(5, dtype=torch.float64), eps=1e-300)
    assert np.allclose(y, ymp, rtol=4 * 2.0 ** -53, atol=0)  # 4 u_64: tighter than ORACLE, as before


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


def test_centring_keeps_its_bits_below_the_normal_range():
    """x - mean(x) for a row of float64 subnormals: rounded there, each d_i would lose up to
    2**-1075, a large fraction of d_i, and rho (1e6 here) carries that into y (2.2 times the oracle's term, before).  The oracle
    scales such rows up first; it stays within its own error term."""
    x = torch.tensor([[5.887580462970005e-309, 4.615404459250156e-309]], dtype=torch.float64)  # d = ±6.4e-310
    args = dict(x=x, weight=torch.ones(2, dtype=torch.float64), bias=torch.zeros(2, dtype=torch.float64), eps=1e-12)
    (f64,) = oracle.forward("layer_norm", **args)
    exact = oracle.forward("layer_norm", path="mpmath", **args)
    (bound,) = oracle.OPS["layer_norm"].forward_bound(args, exact, kernel=False)
    assert np.all(np.abs(f64 - exact[0]) <= bound)


def test_silu_far_below_negligible_is_float64s_own_zero():
    """For g < ``swiglu.NEGLIGIBLE`` the float64 path skips mpmath: every product of silu(g) < 0
    or silu'(g) < 0 with finite u and dy is below 2**-1075, so both paths give the zero of sign
    sign(-u), sign(-u dy), sign(-dy).  Just above the cut (g = -2000) dy u silu'(g) with huge u
    and dy is a normal double (~e**-573), which only mpmath finds."""
    big = 1.7e308
    g = torch.tensor([[swiglu.NEGLIGIBLE - 0.5, -1e4, -3e38, -1.7e308, -2000.0]], dtype=torch.float64)
    u = torch.tensor([[big, -big, 3.0, -big, big]], dtype=torch.float64)
    dy = torch.tensor([[-big, big, big, 2.0, big]], dtype=torch.float64)
    su, sd = np.sign(u.numpy()[0, :4]), np.sign(dy.numpy()[0, :4])
    for path in ("float64", "mpmath"):
        (y,) = oracle.forward("swiglu", path=path, gate=g, up=u)
        grads = oracle.vjp("swiglu", (dy,), path=path, gate=g, up=u)
        for name, v, sign in (("y", y, -su), ("dgate", grads["gate"], -su * sd), ("dup", grads["up"], -sd)):
            assert np.all(v[0, :4] == 0) and np.array_equal(np.signbit(v[0, :4]), sign < 0), f"{path} {name}: {v}"
        assert grads["gate"][0, 4] != 0, f"{path}: above the cut u dy silu'(g) is a normal double"


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_tails_float64_zero_below_negligible_and_mpmath_above(approximate):
    """Below ``geglu.NEGLIGIBLE`` every product of gelu(g) or gelu'(g) (both < 0 there) with finite
    u and dy is below 2**-1075: both paths give y and dup the zero of sign sign(-u), sign(-dy), and
    dgate a zero (float64's gelu'(g) = Phi + g phi adds +0 and -0, so its zero's sign is not kept;
    no check reads a zero's sign).
    Between it and ``geglu.UNDERFLOW``, Phi(g) or sigma(2 t) is subnormal or zero in float64, yet
    gelu(g) u with huge u is a normal double: the float64 path must get mpmath's value (it got 0
    before the region was sent to mpmath)."""
    big = 1.7e308
    lo, hi = geglu.NEGLIGIBLE[approximate], geglu.UNDERFLOW[approximate]
    g = torch.tensor([[lo - 0.5, -1e4, -300.0, (lo + hi) / 2, hi - 1]], dtype=torch.float64)
    u = torch.tensor([[big, -big, -big, big, big]], dtype=torch.float64)
    dy = torch.tensor([[-big, big, 2.0, big, big]], dtype=torch.float64)
    su, sd = np.sign(u.numpy()[0, :3]), np.sign(dy.numpy()[0, :3])
    got = {}
    for path in ("float64", "mpmath"):
        args = dict(gate=g, up=u, approximate=approximate)
        (y,) = oracle.forward("geglu", path=path, **args)
        grads = oracle.vjp("geglu", (dy,), path=path, **args)
        for name, v, sign in (("y", y, -su), ("dup", grads["up"], -sd)):
            assert np.all(v[0, :3] == 0) and np.array_equal(np.signbit(v[0, :3]), sign < 0), f"{path} {name}: {v}"
        assert np.all(grads["gate"][0, :3] == 0), f"{path} dgate: {grads['gate']}"
        got[path] = (y[0, 3:], grads["gate"][0, 3:], grads["up"][0, 3:])
    for f64, mp in zip(*got.values()):
        assert np.all(mp != 0) and np.all(np.abs(f64 - mp) <= 8 * 2.0 ** -53 * np.abs(mp)), (f64, mp)


def test_deep_norm_claims_nothing_where_rounded_parts_overflow():
    """z = alpha x + sublayer(x) = 65497.9 is below float16's 65504, but alpha x = 32817 and
    sublayer(x) = 32680.9 round to 32832 and 32688, whose sum rounds to inf: a correct float16
    kernel (the eager one) gets NaN there, and the bound must make no claim on that row."""
    h = torch.float16
    args = dict(x=torch.tensor([[32800.0, 0.0]], dtype=h),
                sub_weight=torch.tensor([[0.99560546875, 0.0], [0.0, 0.0]], dtype=h),
                sub_bias=torch.tensor([25.0, 0.0], dtype=h), weight=torch.ones(2, dtype=h), bias=torch.zeros(2, dtype=h),
                alpha=32817 / 32800, eps=1e-5)
    exact = oracle.forward("deep_norm", **args)
    got = deep_norm(args["x"], affine_sublayer(args["sub_weight"], args["sub_bias"]), args["alpha"],
                    args["weight"], args["bias"], args["eps"])
    assert np.all(np.isfinite(exact[0])) and torch.isnan(got).all(), (exact, got)
    (bound,) = oracle.OPS["deep_norm"].forward_bound(args, exact)
    assert np.all(np.isinf(bound)), bound


def test_deep_norm_backward_claims_nothing_where_dz_overflows():
    """A constant float16 row with eps = 1e-10 has rho |g| ~ 1e5 at z, past float16's 65504: a
    correct kernel holding dz in float16 gets inf there, and inf * 0 = NaN through a sublayer of
    zeros.  The eager kernel does; the bound must make no claim on that row's dx."""
    h = torch.float16
    x = torch.full((1, 4), 100.0, dtype=h).requires_grad_()
    args = dict(x=x.detach(), sub_weight=torch.zeros(4, 4, dtype=h), sub_bias=torch.zeros(4, dtype=h),
                weight=torch.ones(4, dtype=h), bias=torch.zeros(4, dtype=h), alpha=2.0, eps=1e-10)
    cot = (torch.tensor([[1.0, -1.0, 0.5, 0.25]], dtype=h),)
    y = deep_norm(x, affine_sublayer(args["sub_weight"], args["sub_bias"]), args["alpha"], args["weight"],
                  args["bias"], args["eps"])
    (dx,) = torch.autograd.grad(y, (x,), cot)
    exact = oracle.vjp("deep_norm", cot, **args)
    assert torch.isnan(dx).any() and np.all(np.isfinite(exact["x"])), (dx, exact["x"])
    assert np.all(np.isinf(oracle.OPS["deep_norm"].grad_bound(args, cot, exact)["x"]))


@pytest.mark.parametrize("got, ok", [(math.inf, True), (-math.inf, True), (65504.0, True), (math.nan, False)])
def test_an_inf_within_the_bound_of_either_sign_passes(got, ok):
    """exact -0.54 with a bound of 1.6e13 (a cancelling dx, eps = 1e-12): values within the bound
    reach past float16's range on both sides, so a correct kernel may round to +inf or to -inf."""
    a = assess("dx", torch.tensor([got], dtype=torch.float16), np.array([-0.54]), np.array([1.6e13]), torch.float16)
    assert a.ok == ok, a.detail
    narrow = assess("dx", torch.tensor([got], dtype=torch.float16), np.array([-0.54]), np.array([1e3]), torch.float16)
    assert not narrow.ok, narrow.detail  # a bound of 1e3 reaches neither inf nor 65504


def test_lowest_bit_is_the_values_own_lattice():
    got = lowest_bit(np.array([1000.0, 3.0, 0.75, -12.0, 2.0 ** -1074, 0.0, np.inf, np.nan]))
    assert got.tolist() == [8.0, 1.0, 0.25, 4.0, 2.0 ** -1074, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("in_dtype, value, n, eps, exact_mean", [
    (torch.float16, 1000.0, 4096, 1e-4, True),  # 4096 * 1000 <= 2**24 * 8: every partial sum exact in float32
    (torch.float16, 1000.0, 769, 1e-4, False),  # n not a power of two: the division may round
    (torch.bfloat16, 3.0, 16384, 1e-12, True),
    (torch.float32, 100.0, 64, 1e-12, True),  # 100 = 25 * 4: 64 * 100 <= 2**24 * 4
    (torch.float32, 1 + 2.0 ** -23, 64, 1e-12, False),  # its lowest bit is 2**-23: 2 copies already round
])
def test_a_constant_row_whose_mean_is_exact_gets_a_tight_bound(in_dtype, value, n, eps, exact_mean):
    """A constant row with a small eps (float16: dx = rho g within its range): where every correct
    kernel's mean is exact (its sum exact on the value's own lattice in any order, n a power of two:
    ``error_model.exact_mean_rows``) the kernel's xhat is 0 and its rho 1/sqrt(eps) to a few ulps, so
    dx = rho (g - mean g) is bounded to a few ulps of itself: zeros for dx (a wrong backward) do not
    pass.  Elsewhere the mean may be ulps off, sqrt(eps) is below that, rho may be anything up to
    1/sqrt(eps), and the bound is |dx| itself or more."""
    rng, dtype = np.random.default_rng(0), in_dtype
    args = dict(x=torch.full((2, n), value, dtype=dtype), weight=torch.ones(n, dtype=dtype),
                bias=torch.from_numpy(fmt(dtype).round(rng.standard_normal(n) / 4)).to(dtype), eps=eps)
    cot = (torch.from_numpy(fmt(dtype).round(rng.standard_normal((2, n)))).to(dtype),)
    exact = oracle.vjp("layer_norm", cot, **args)
    bound = oracle.OPS["layer_norm"].grad_bound(args, cot, exact)["x"]
    ratio = float(np.median(bound / np.abs(exact["x"])))
    assert (ratio < 0.1 if exact_mean else ratio > 1), ratio  # bfloat16: 2 u_o of it is 0.008


def _fp8(value) -> torch.Tensor:
    return torch.full((1, 4), float(value)).to(torch.float8_e4m3fn)


def test_fp8_output_is_the_exactly_rounded_value():
    """v = 19 (1 - 5e-19) lies below the e4m3fn midpoint 19 by less than float64 resolves: rounded to
    float64 it is 19.0, a tie that rounds (to even) up to 20, while v rounds down to 18.  Both paths
    give a v that rounds to 18.  A float32 kernel's own error (~u_c) reaches past the midpoint, so
    it may give 18 or 20, and nothing else."""
    args = dict(x=torch.ones(1, 4), weight=torch.full((4,), 19.0), eps=1e-18, scale=1.0)
    for path in ("float64", "mpmath"):
        (v,) = oracle.forward("rms_norm_fp8", path=path, **args)
        assert (E4M3.round(v) == 18).all(), path
    (v,) = oracle.forward("rms_norm_fp8", **args)
    (bound,) = oracle.OPS["rms_norm_fp8"].forward_bound(args, (v,))
    verdicts = {got: assess("y", _fp8(got), v, bound, torch.float8_e4m3fn, quantised=True).ok
                for got in (16, 18, 20, 22)}
    assert verdicts == {16: False, 18: True, 20: True, 22: False}


@pytest.mark.parametrize("w, scale, allowed, refused", [
    (1.3, 1.0, 1.25, 1.375),  # v ~ 1.3, far from the midpoint 1.3125: bit-exact
    (1.0, 2.0 ** -10, 448.0, 416.0),  # v ~ 1024: saturates, to 448 exactly
    (2.0 ** -10 * (1 + 2.0 ** -10), 1.0, 2.0 ** -9, 0.0),  # just past the tie between 0 and 2**-9: not flushed
])
def test_fp8_bit_exact_away_from_midpoints(w, scale, allowed, refused):
    """Where the bound stays inside one rounding interval, only the exactly rounded value passes
    (x a row of ones: v = w / scale (1 - eps / 2))."""
    args = dict(x=torch.ones(1, 4), weight=torch.full((4,), w), eps=1e-30, scale=scale)
    (v,) = oracle.forward("rms_norm_fp8", **args)
    (bound,) = oracle.OPS["rms_norm_fp8"].forward_bound(args, (v,))
    assert assess("y", _fp8(allowed), v, bound, torch.float8_e4m3fn, quantised=True).ok
    assert not assess("y", _fp8(refused), v, bound, torch.float8_e4m3fn, quantised=True).ok


@pytest.mark.parametrize("op", ["rms_norm_fp8", "add_rms_norm_fp8"])
@pytest.mark.parametrize("scale", [0.0, -0.5, math.inf, math.nan])
def test_bad_scale_is_a_clear_value_error(op, scale):
    args = oracle.OPS[op].sample(torch.float32)
    with pytest.raises(ValueError, match=f"^{op}: scale must be a positive finite float"):
        oracle.forward(op, **{**args, "scale": scale})


@pytest.mark.parametrize("got, ok", [(-0.0, True), (-math.inf, True), (1.0, True)])
def test_an_infinite_exact_value_outside_the_contract_is_not_claimed(got, ok):
    """A gated norm's y = r s past float64's range on a row whose x^2 overflows float64: the bound
    -inf claims nothing there (a float64 kernel's rho underflows to 0 and gives -0.0); the same
    element under a bound of +inf must still be the exact -inf."""
    actual, exact = torch.tensor([got], dtype=torch.float64), np.array([-np.inf])
    assert assess("y", actual, exact, np.array([-np.inf]), torch.float64).ok == ok
    assert assess("y", actual, exact, np.array([np.inf]), torch.float64).ok == (got == -math.inf)


@given(st.integers(1, 64), st.floats(1e-12, 1.0), st.floats(1e-6, 1e-2), st.integers(0, 2 ** 16))
def test_moved_rows_move_rho_by_at_most_moved_rho(n, eps, size, seed):
    """Rows moved by at most delta_i each change rho = 1 / sqrt(mean(s^2) + eps) by at most
    ``moved_rho`` relative, whichever way each moves; for rounded rows that is u_s (1 + O(u_s))."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((4, n)) * 10.0 ** rng.uniform(-3, 3, (4, 1))
    delta = size * np.abs(s) * rng.uniform(0, 1, s.shape) + size * rng.uniform(0, 1, s.shape)
    moved = s + delta * rng.choice([-1.0, 1.0], s.shape)
    rho = 1 / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)
    rho_moved = 1 / np.sqrt(np.mean(moved * moved, axis=-1, keepdims=True) + eps)
    assert np.all(np.abs(rho_moved / rho - 1) <= moved_rho(rho, delta) * (1 + 1e-9))
    assert np.allclose(moved_rho(rho, 2.0 ** -11 * np.abs(s)), 2.0 ** -11 * np.sqrt(1 - eps * rho * rho),
                       rtol=2.0 ** -10)


@pytest.mark.parametrize("change, message", [
    (dict(norm_before_gate=1), "norm_before_gate must be True or False, got 1"),
    (dict(norm_before_gate="yes"), "norm_before_gate must be True or False, got 'yes'"),
    (dict(z=torch.zeros(2, 3)), "z must be of shape"),
    (dict(group_size=3), "group_size must be a divisor of the row length 4, got 3"),
    (dict(group_size=0), "group_size must be a positive integer, got 0"),
    (dict(group_size=2.0), "group_size must be a positive integer, got 2.0"),
])
def test_gated_norm_bad_input_is_a_clear_value_error(change, message):
    args = {**dict(x=torch.ones(2, 4), z=torch.ones(2, 4), weight=torch.ones(4), eps=1e-5, norm_before_gate=True),
            **change}
    with pytest.raises(ValueError, match=f"^rms_norm_gated: {re.escape(message)}"):
        oracle.forward("rms_norm_gated", **args)
    if "norm_before_gate" in change or "group_size" in change:  # normcert's own kernels say the same
        from ...impls import triton_gated_norm  # noqa: PLC0415 - Triton imported where it is used
        for kernel in (eager.rms_norm_gated, triton_gated_norm.rms_norm_gated):
            with pytest.raises(ValueError, match=f"^rms_norm_gated: {re.escape(message)}"):
                kernel(**args)


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_grouped_gated_norm_is_the_ungrouped_op_per_group_and_agrees_with_mpmath(norm_before_gate):
    """group_size G: each group of G consecutive elements normalised on its own (Mamba-2's
    RMSNormGated(group_size=G)); float64 and mpmath agree to the oracle's own bound, forward and VJP."""
    gen = torch.Generator().manual_seed(3)
    x, z, dy = (torch.randn(3, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    w = torch.randn(16, generator=gen, dtype=torch.float64)
    args = dict(x=x, z=z, weight=w, eps=1e-6, norm_before_gate=norm_before_gate, group_size=4)
    (y,) = oracle.forward("rms_norm_gated", **args)
    for j in range(4):
        cols = slice(4 * j, 4 * j + 4)
        (part,) = oracle.forward("rms_norm_gated", x=x[:, cols], z=z[:, cols], weight=w[cols], eps=1e-6,
                                 norm_before_gate=norm_before_gate, group_size=None)
        assert np.array_equal(y[:, cols], part)
    assert not np.allclose(y, oracle.forward("rms_norm_gated", **{**args, "group_size": None})[0])
    rec = oracle.OPS["rms_norm_gated"]
    mp = oracle.forward("rms_norm_gated", path="mpmath", **args)
    agree("rms_norm_gated", "y", y, mp[0], rec.forward_bound(args, mp, kernel=False)[0])
    g64, gmp = oracle.vjp("rms_norm_gated", (dy,), **args), oracle.vjp("rms_norm_gated", (dy,), path="mpmath", **args)
    bounds = rec.grad_bound(args, (dy,), gmp)
    for k in g64:
        assert bounds[k].shape == g64[k].shape and np.all(np.isfinite(bounds[k]))
        agree("rms_norm_gated", "d" + k, g64[k], gmp[k], bounds[k])


def test_gated_norm_may_give_nan_where_r_is_below_lam_beside_an_infinite_gate():
    """Gate after, z = +inf: y = r * inf is +inf exactly, but r = 1.4e-7 rounds to a float16
    subnormal, which a correct kernel may flush: 0 * inf = NaN is allowed there, and only there."""
    args = dict(x=torch.tensor([[1.0, 1e-7, 1.0]], dtype=torch.float16),
                z=torch.tensor([[math.inf, math.inf, 1.0]], dtype=torch.float16),
                weight=torch.ones(3, dtype=torch.float16), eps=1e-6, norm_before_gate=True)
    (y,) = oracle.forward("rms_norm_gated", **args)
    assert np.isinf(y[0, :2]).all()
    assert oracle.OPS["rms_norm_gated"].indeterminate(args).tolist() == [[False, True, False]]
    assert not oracle.OPS["rms_norm_gated"].indeterminate({**args, "norm_before_gate": False}).any()


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_gated_norm_far_negative_gates_agree_with_mpmath(norm_before_gate):
    """Gates below -708 (sigma(z) subnormal or 0 in float64) beside huge and tiny x and a tiny eps: the float64 path redoes the products that matter and keeps float64's zero for the rest
    (``rms_norm_gated._gate_risky``); it must agree with mpmath to its own bound."""
    z = torch.tensor([[-700.0, -750.0, -800.0, -1500.0, -3000.0, 1.0]], dtype=torch.float64)
    args = dict(x=torch.tensor([[1e300, 1e-300, 1e200, 1e300, 1e300, 1e-200]], dtype=torch.float64), z=z,
                weight=torch.full((6,), 3.0, dtype=torch.float64), eps=1e-300, norm_before_gate=norm_before_gate)
    rec = oracle.OPS["rms_norm_gated"]
    f64, mp = oracle.forward("rms_norm_gated", **args), oracle.forward("rms_norm_gated", path="mpmath", **args)
    agree("rms_norm_gated", "y", f64[0], mp[0], rec.forward_bound(args, mp, kernel=False)[0])
    cot = (torch.full((1, 6), 1e3, dtype=torch.float64),)
    g64, gmp = oracle.vjp("rms_norm_gated", cot, **args), oracle.vjp("rms_norm_gated", cot, path="mpmath", **args)
    bounds = rec.grad_bound(args, cot, gmp)
    for k in g64:
        agree("rms_norm_gated", "d" + k, g64[k], gmp[k], bounds[k])


def _band_gates(lo, hi):
    return lambda rng, n: np.concatenate([[lo, np.nextafter(hi, -np.inf), (lo + hi) / 2], rng.uniform(lo, hi, n - 3)])


def _near_zero_gates(rng, n):  # 0 < |g| < 2**-900: subnormal ones, the smallest and the largest included
    g = np.ldexp(rng.uniform(0.5, 1, n) * rng.choice([-1, 1], n), rng.integers(-1074, -900, n))
    g[:3] = [5e-324, -5e-324, np.nextafter(special.NEAR_ZERO, 0)]
    return g


@pytest.mark.parametrize("op, approximate, gates", [
    ("swiglu", None, _band_gates(swiglu.NEGLIGIBLE, swiglu.UNDERFLOW)),
    ("geglu", "none", _band_gates(geglu.NEGLIGIBLE["none"], geglu.UNDERFLOW["none"])),
    ("swiglu", None, _near_zero_gates), ("geglu", "none", _near_zero_gates), ("geglu", "tanh", _near_zero_gates)],
    ids=["swiglu-underflow", "geglu-underflow", "swiglu-near-zero", "geglu-near-zero", "geglu-tanh-near-zero"])
def test_the_float64_form_of_a_band_float64_loses_is_mpmath_s_value_to_the_oracle_term(op, approximate, gates):
    """Where e**g or Phi(g) underflows float64 (``swiglu._band``, ``geglu._erf_band``), and where
    a gate near 0 makes g sigma(g) a subnormal (``special.NEAR_ZERO_TAILS``), the float64 path no longer
    sends each element to mpmath: its value, formed by ``exp_times``, must be mpmath's to ORACLE
    (|exact| + LAM_64), for y, dgate and dup, over up and dy of every binade (normal, subnormal
    and past 2**1000 results), the band's ends included."""
    rng = np.random.default_rng(7)
    n = 1500
    g = gates(rng, n)
    u, d = (np.ldexp(rng.uniform(0.5, 1, n) * rng.choice([-1, 1], n), rng.integers(-1074, 1024, n)) for _ in "ud")
    kw = dict(gate=torch.tensor(g[None]), up=torch.tensor(u[None]), **({"approximate": approximate} if approximate else {}))
    dy = (torch.tensor(d[None]),)
    f64 = (*oracle.forward(op, **kw), *oracle.vjp(op, dy, **kw).values())
    mp = (*oracle.forward(op, path="mpmath", **kw), *oracle.vjp(op, dy, path="mpmath", **kw).values())
    for name, a, b in zip(("y", "dgate", "dup"), f64, mp):
        a, b = np.asarray(a), np.asarray(b)
        inf = np.isinf(b)  # u d / 2 past float64's range: the same infinity
        assert not np.isnan(b).any() and np.array_equal(a[inf], b[inf]), name
        a, b = a[~inf], b[~inf]
        held = np.abs(b[b != 0])  # the band's values, not its zeros: normal ones and subnormal ones
        assert held.size > n / 10 and (held < LAM_64).any() and (held > LAM_64).any(), name
        err, bound = np.abs(a - b), ORACLE * (np.abs(b) + LAM_64)
        assert (err <= bound).all(), (name, (err / bound).max())


def test_exp_times_forms_the_product_before_rounding():
    """e**t times factors on float64 with nothing lost to an intermediate under- or overflow
    (float64's own e**-1000 is 0; times 1e300 the product is 1e-134), against mpmath."""
    t = np.array([-1000.0, -745.5, -1.0, 0.0, 3.0, 700.0, -2000.0])
    f = np.array([1e300, 1e200, 2.0, 5.0, 1e-300, 1e-300, 1e300])
    got = F64.exp_times(t, f, t)
    with mpmath.workprec(256):
        want = MP.to_float64(MP.exp_times(MP.array(t), MP.array(f), MP.array(t)))
    assert np.all(np.abs(got - want) <= 4 * 2.0 ** -53 * np.abs(want)), (got, want)
    assert got[0] != 0 and np.exp(t[0]) * f[0] == 0  # what the plain float64 product loses


DQ = dict(x=torch.ones(2, 4), weight=torch.ones(4), eps=1e-5, qdtype="int8", scale_ub=None)


@pytest.mark.parametrize("change, message", [
    (dict(qdtype="float8_e5m2"), "qdtype must be one of 'float8_e4m3fn', 'int8', got 'float8_e5m2'"),
    (dict(qdtype=None), "qdtype must be one of 'float8_e4m3fn', 'int8', got None"),
    (dict(scale_ub=0.0), "scale_ub must be a positive finite float, got 0.0"),
    (dict(scale_ub=-1.0), "scale_ub must be a positive finite float, got -1.0"),
    (dict(scale_ub=math.inf), "scale_ub must be a positive finite float, got inf"),
    (dict(scale_ub=math.nan), "scale_ub must be a positive finite float, got nan"),
])
@pytest.mark.parametrize("op", ["rms_norm_dynamic_quant", "add_rms_norm_dynamic_quant"])
def test_dynamic_quant_bad_input_is_a_clear_value_error(op, change, message):
    """From the oracle and from each of normcert's own kernels of the op."""
    args = {**DQ, **({"residual": torch.zeros(2, 4)} if op.startswith("add") else {}), **change}
    with pytest.raises(ValueError, match=f"^{op}: {re.escape(message)}"):
        oracle.forward(op, **args)
    from ...impls import registry
    for impl in (i for i in registry() if i.op == op and i.backend in ("eager", "triton")):
        with pytest.raises(ValueError, match=f"^{op}: {re.escape(message)}"):
            oracle.OPS[op].call(impl.fn, args)


GQ = dict(x=torch.ones(2, 128), weight=torch.ones(128), eps=1e-5, group=32, scale_format="ue8m0", layout="row_major")


@pytest.mark.parametrize("change, message", [
    (dict(group=0), "group must be a positive integer, got 0"),
    (dict(group=-32), "group must be a positive integer, got -32"),
    (dict(group=32.0), "group must be a positive integer, got 32.0"),
    (dict(group=48), "group must be a divisor of the row length 128, got 48"),
    (dict(scale_format="e8m0"), "scale_format must be one of 'float32', 'ue8m0', got 'e8m0'"),
    (dict(layout="transposed"), "layout must be one of 'row_major', 'column_major', 'mn_major', got 'transposed'"),
])
def test_group_quant_bad_input_is_a_clear_value_error(change, message):
    """From the oracle and from each of normcert's own kernels of the op (on CPU: Triton under the
    interpreter); a group that does not divide the row is no bad input to a kernel that declares
    tail=partial (normcert's do: its last group is shorter)."""
    op, args = "rms_norm_group_quant", {**GQ, **change}
    with pytest.raises(ValueError, match=f"^{op}: {re.escape(message)}"):
        oracle.forward(op, **args)
    from ...impls import registry
    for impl in (i for i in registry() if i.op == op and i.backend in ("eager", "triton")):
        if "divisor" in message and impl.domain.tail == "partial":
            continue
        with pytest.raises(ValueError, match=f"^{op}: {re.escape(message)}"):
            oracle.OPS[op].call(impl.fn, args)


def test_dynamic_quant_y_is_checked_against_the_kernels_own_scale():
    """y is judged against the scale the kernel reports, the scale against the exact one: a kernel
    whose scale is 2x off (e4m3fnuz's 224 for e4m3fn) but whose y is Q(v / that scale) fails on its
    scale alone; one that reports the exact scale but quantises with another fails on y."""
    rec = oracle.OPS["rms_norm_dynamic_quant"]
    x = torch.linspace(-3, 3, 64, dtype=torch.float64).reshape(1, 64).float()
    args = dict(x=x, weight=torch.ones(64), eps=1e-5, qdtype="float8_e4m3fn", scale_ub=None)
    y, scale = oracle.forward("rms_norm_dynamic_quant", **args)

    def verdicts(used, reported):
        q = torch.from_numpy(E4M3.round(y * scale[..., None] / used)).to(torch.float8_e4m3fn)
        kernel_scale = np.full(scale.shape, np.float32(reported), np.float64)  # one per row, as a kernel's
        y_bound, scale_bound = rec.forward_bound(args, (y, scale), kernel_scale=kernel_scale)
        return (assess("scales", torch.tensor(kernel_scale, dtype=torch.float32), scale, scale_bound,
                       torch.float32).ok,
                assess("y", q, rescaled(y, scale, kernel_scale), y_bound, torch.float8_e4m3fn, quantised=True).ok)

    assert verdicts(np.float32(scale), scale) == (True, True)
    assert verdicts(np.float32(2 * scale), 2 * scale) == (False, True)
    assert verdicts(np.float32(2 * scale), scale) == (True, False)


@pytest.mark.parametrize("op", sorted(oracle.OPS))
def test_the_rows_resolved_on_mpmath_stay_on_the_case_device(op):
    """A quantised output near a midpoint is evaluated again on mpmath on the rows concerned
    (``oracle._resolve``): those rows' arguments keep the case's device, counts included (a counts
    tensor made on the CPU beside a CUDA x was refused by ``Op.check``: the first GPU run's
    silu_and_mul_group_quant_masked "counts must be on x's device cuda:0, got cpu").  The meta
    device stands for a device other than the CPU."""
    rec = oracle.OPS[op]
    args = rec.sample(torch.float32, "meta")
    sub = oracle.row_args(rec, args, np.array([0, 2]))
    placed = {k: v.device.type for k, v in sub.items() if isinstance(v, torch.Tensor)}
    assert placed and set(placed.values()) == {"meta"}, placed
