"""The error model's bounds hold for every kernel within their own stated parts, and are reached.

A bound of the form "the kernel's rho is within rho_rel, its xhat within dxhat, so its dx is
within B" must hold for *every* rho' and xhat' inside those stated parts, not only to first order
in them: where dxhat is large (a near-constant row, whose mean a correct kernel may get ulps off,
amplified by rho), the products of two errors are as large as the errors themselves.  Each test
plays the adversary: it takes the parts the model states, moves them to the ends of their
intervals in the patterns a kernel can produce (every xhat shifted one way, as a mean error does;
with and against the cotangent), evaluates the VJP formula exactly (float64, whose own rounding
is far below a float32 kernel's bound) and asserts the result lies within the stated bound.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ... import oracle
from ...oracle.bounds_gated import argument_move
from ...oracle.bounds_norms import NormInput, rms_norm_bwd
from ...oracle.deep_norm import affine_sublayer
from ...oracle.error_model import (Context, exact_mean_rows, normalisation_error, normalisation_vjp_error, row_mean,
                                   signed_reach)
from .meta import planted
from ..search.strategies import round_up_row


def _patterns(rng, g):
    """Sign patterns for moved values: all one way (a mean error), with and against g, random."""
    ones = np.ones_like(g)
    return [ones, -ones, np.sign(g), -np.sign(g), rng.choice([-1.0, 1.0], g.shape)]


def _rows(rng, n, offset, spread):
    """Four float32 rows around +-10**offset with a relative spread 10**spread (0: constant)."""
    mean = rng.choice([-1.0, 1.0], (4, 1)) * 10.0 ** offset
    z = mean * (1 + (10.0 ** spread if spread > -9 else 0.0) * rng.standard_normal((4, n)))
    return torch.from_numpy(z).float().double().numpy()  # on float32's lattice, as a kernel reads it


@given(st.integers(2, 256), st.floats(0, 4), st.sampled_from([-10, -7, -5, -3, 0]),
       st.sampled_from([1e-12, 1e-6, 1e-3]), st.integers(0, 2 ** 16))
def test_centred_vjp_bound_holds_for_every_xhat_and_rho_within_theirs(n, offset, spread, eps, seed):
    """dz = rho (g - mean g - xhat mean(g xhat)): with the kernel's rho' = rho (1 +- rho_rel) and
    xhat' = xhat + s dxhat, the exact dz' stays within ``normalisation_vjp_error``."""
    rng = np.random.default_rng(seed)
    ctx = Context(torch.float32)
    z = _rows(rng, n, offset, spread)
    norm = normalisation_error(ctx, z, eps)
    g = rng.standard_normal(z.shape)
    bound = normalisation_vjp_error(ctx, norm, g)
    claim = np.broadcast_to(norm.claim, z.shape) & np.isfinite(bound)
    dz = norm.rho * (g - row_mean(g) - norm.xhat * row_mean(g * norm.xhat))
    for r in (-1.0, 1.0):
        rho = norm.rho * (1 + r * norm.rho_rel)
        for s in _patterns(rng, g):
            xhat = norm.xhat + s * norm.dxhat
            moved = rho * (g - row_mean(g) - xhat * row_mean(g * xhat))
            err = np.abs(moved - dz)
            assert np.all(err[claim] <= bound[claim]), float(np.max(err[claim] / bound[claim]))


@given(st.integers(2, 256), st.floats(-2, 2), st.floats(1e-3, 0.6), st.sampled_from([1e-12, 1e-6, 1e-3]),
       st.integers(0, 2 ** 16))
def test_rms_vjp_bound_holds_for_every_moved_row_and_rho_within_theirs(n, scale, size, eps, seed):
    """dx = rho g - rho^3 x mean(g x) on rows the kernel sees moved by up to delta_i (the gated
    norm's x silu(z) formed in c): with x' = x + s delta, rho' the exact rho of x' and then off by
    the kernel's own rho error either way, the exact dx' stays within ``rms_norm_bwd``'s bound."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((4, n)) * 10.0 ** scale).float()
    delta = size * np.abs(x.double().numpy()) * rng.uniform(0.5, 1, x.shape)
    dy = torch.from_numpy(rng.standard_normal(x.shape)).float()
    values, g = x.double().numpy(), dy.double().numpy()
    args = dict(x=x, weight=None, eps=eps)
    bound = rms_norm_bwd(args, (dy,), {}, rows=NormInput(values, error=delta))["x"]
    claim = np.isfinite(bound)

    def dx(rows, rho):
        return rho * g - rho ** 3 * rows * row_mean(g * rows)

    exact = dx(values, 1 / np.sqrt(row_mean(values * values) + eps))
    ctx = Context(torch.float32)
    own = ctx.gam(n + 1) / 2 + 4 * ctx.uc  # rho's own error, as ``inverse_rms`` states it
    for s in _patterns(rng, g):
        moved = values + s * delta
        rho = 1 / np.sqrt(row_mean(moved * moved) + eps)
        for r in (-1.0, 1.0):
            err = np.abs(dx(moved, rho * (1 + r * own)) - exact)
            assert np.all(err[claim] <= bound[claim]), float(np.max(err[claim] / bound[claim]))


def _worst_order_sum(t):
    """A float32 sum of each row of t left to right, its positive terms first: every partial sum
    is as large as any order can make it (``error_model.signed_reach``)."""
    ordered = np.take_along_axis(t, np.argsort(-t, axis=-1, kind="stable"), axis=-1)
    return np.add.accumulate(ordered.astype(np.float32), axis=-1, dtype=np.float32)[..., -1:]


@given(st.integers(1, 512), st.floats(0, 4), st.sampled_from([-9, -5, -2, 0]),
       st.sampled_from([1e-12, 1e-5, 1e-2]), st.integers(0, 2 ** 16))
def test_centred_vjp_bound_holds_for_a_float32_kernel_summing_in_the_worst_order(n, offset, spread, eps, seed):
    """A two-pass float32 LayerNorm backward, every sum left to right with its positive terms first,
    stays within ``normalisation_vjp_error`` of the exact dz: the bound's rounding terms (the signed
    reach of each sum, gam(4) pointwise) hold for a real computation, not only for the adversary."""
    rng = np.random.default_rng(seed)
    ctx = Context(torch.float32)
    z = _rows(rng, n, offset, spread)
    g = torch.from_numpy(rng.standard_normal(z.shape)).float().double().numpy()
    norm = normalisation_error(ctx, z, eps)
    bound = normalisation_vjp_error(ctx, norm, g)
    dz = norm.rho * (g - row_mean(g) - norm.xhat * row_mean(g * norm.xhat))
    f32, count = np.float32, np.float32(n)
    z32, g32 = z.astype(f32), g.astype(f32)
    d = z32 - _worst_order_sum(z32) / count
    rho = f32(1) / np.sqrt(_worst_order_sum(d * d) / count + f32(eps))
    xhat = d * rho
    got = rho * (g32 - _worst_order_sum(g32) / count - xhat * (_worst_order_sum(g32 * xhat) / count))
    claim = np.broadcast_to(norm.claim, z.shape) & np.isfinite(bound)
    err = np.abs(got.astype(np.float64) - dz)
    assert np.all(err[claim] <= bound[claim]), float(np.max(err[claim] / bound[claim]))


@given(st.integers(2, 4096), st.floats(-1, 1), st.integers(0, 2 ** 16))
def test_a_float32_sum_in_the_worst_order_is_within_gamma_of_its_signed_reach(n, skew, seed):
    """Every partial sum is a subset sum, at most max(sum t+, sum t-) = ``signed_reach``: summed left
    to right, positive terms first (each partial as large as any order makes it) in float32, the
    error stays within gam(n - 1) of it."""
    rng = np.random.default_rng(seed)
    t = torch.from_numpy(rng.standard_normal((8, n)) + skew).float().double().numpy()
    err = np.abs(_worst_order_sum(t).astype(np.float64) - np.sum(t, axis=-1, keepdims=True))
    bound = Context(torch.float32).gam(n - 1) * signed_reach(t)
    assert np.all(err <= bound), float(np.max(err / bound))


@given(st.floats(-400, 400), st.sampled_from([2, 7, 10]))
def test_gelu_tanh_forms_move_within_argument_move(t, k):
    """P = 1 + tanh(t) = 2 sigma(2 t) with the argument off by gam(k) relative, either way: by the
    sigmoid route P moves by at most ``argument_move`` relative, by the tanh route by twice it
    (``bounds_gated.gelu_p``); for t >> 0 that is next to nothing, as P is 2 whatever the error."""
    gam = Context(torch.float32).gam(k)
    p = 2 / (1 + np.exp(-2 * t))
    for theta in (-gam, gam):
        moved_t = t * (1 + theta)
        by_sigmoid = abs(2 / (1 + np.exp(-2 * moved_t)) - p)
        by_tanh = abs(np.tanh(moved_t) - np.tanh(t))
        allowed = argument_move(np.float64(t), gam) * p
        own = 8 * 2.0 ** -53 * max(p, 1.0)  # this test's float64 P and tanh, each off by a few u_64
        assert by_sigmoid <= allowed + own
        assert by_tanh <= 2 * allowed + own


def test_tanh_gelu_bound_stays_relative_for_large_gates():
    """gelu(g) = g for g >> 0 whatever the error in tanh's argument: the bound is a few ulps of y
    there (it was 4.7e11 against y = 4.2e7 at g = 6447, where a kernel returning 0 passed)."""
    g = torch.tensor([[6447.5, 100.0, 30.0, 6447.5, 100.0, 30.0]])
    args = dict(x=g, approximate="tanh")
    exact = oracle.forward("gelu_and_mul", **args)
    bound = oracle.OPS["gelu_and_mul"].forward_bound(args, exact)[0]
    assert np.all(bound <= 16 * 2.0 ** -24 * np.abs(exact[0])), bound / np.abs(exact[0])  # before: 27 |y| at 6447


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [64, 1024, 16384])
def test_a_sum_of_squares_that_rounds_up_at_every_step_reaches_the_rms_bound_and_stays_within_it(in_dtype, n):
    """On ``strategies.round_up_row`` rows, a correct RMSNorm that sums its squares left to right
    (``planted.rms_sequential_sum``) errs by the (n - 1) u that the bound's gam(n) term allows: the
    term is needed (the kernel comes within 2x of the bound, so a looser model fails here) and
    enough (the kernel stays within it), at every width."""
    rec = oracle.OPS["rms_norm"]
    x = round_up_row(n, in_dtype, 2).expand(4, n).clone()
    args = {"x": x, "weight": torch.ones(n, dtype=in_dtype), "eps": 1e-12}
    exact = oracle.forward("rms_norm", **args)
    (bound,) = rec.forward_bound(args, exact)
    got = planted.rms_sequential_sum(**args).double().numpy()
    worst = float(np.max(np.abs(got - exact[0]) / bound))
    assert 0.5 < worst <= 1, worst


def test_an_exact_sum_does_not_make_a_welford_mean_exact():
    """Why ``exact_mean_rows`` drops the mean's gam(n) term on constant rows only: the lattice
    argument (float16 values summed in float32 with no rounding, in any order) is about sums, and
    Welford's update, which the model admits, rounds its running mean at every step.  On a float16
    row near 1000 whose float32 sum is exact, a float32 Welford mean is off by many u_c |mean|;
    on a constant row it is exact, as ``exact_mean_rows`` says."""
    def welford(row):
        mu = np.float32(0)
        for k, v in enumerate(row, start=1):
            mu = np.float32(mu + np.float32(np.float32(v - mu) / np.float32(k)))
        return float(mu)

    ctx = Context(torch.float16)
    row = (1000 + np.random.default_rng(0).standard_normal(1024) * 0.5).astype(np.float16).astype(np.float32)
    exact = float(np.sum(row, dtype=np.float64)) / row.size
    assert float(np.sum(row, dtype=np.float32)) == exact * row.size  # the sum is exact in float32
    assert abs(welford(row) - exact) > 16 * ctx.uc * exact
    assert not exact_mean_rows(ctx, row.astype(np.float64)[None], np.zeros((1, row.size)))[0, 0]
    constant = np.full(1024, np.float32(1000.5))
    assert welford(constant) == 1000.5
    assert exact_mean_rows(ctx, constant.astype(np.float64)[None], np.zeros((1, constant.size)))[0, 0]


def test_the_deep_norm_sublayer_is_rounded_once():
    """The sublayer the suite hands deep_norm kernels (``oracle.deep_norm.affine_sublayer``) returns the
    exact affine map rounded once to t's dtype, so the bounds charge the kernel for its own arithmetic
    and not for a matmul of the fixture's (``bounds_norms.fixture_gam``).  A float32 matmul misses it."""
    g = torch.Generator().manual_seed(0)
    n = 128
    t, a = torch.randn(8, n, generator=g), torch.randn(n, n, generator=g) / math.sqrt(n)
    c = torch.randn(n, generator=g) * 0.1
    exact = torch.tensor([[math.fsum([*(x * w for x, w in zip(row, a_i)), c_i]) for a_i, c_i in
                           zip(a.tolist(), c.tolist())] for row in t.tolist()], dtype=torch.float64)
    assert torch.equal(affine_sublayer(a, c)(t), exact.to(torch.float32))
    assert not torch.equal(torch.nn.functional.linear(t, a, c), exact.to(torch.float32))


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_a_row_whose_cotangent_products_overflow_takes_no_claim_and_the_others_keep_theirs(compute):
    """dx = rho (g - xhat mean(g xhat)), g = dy w: where g or sum|g xhat| passes max_c every order
    computes inf - inf, so the row's bound is -inf (no claim, even on an infinite exact value); a
    row beside it keeps its finite bound (the gated norm reached this with dy silu(z), z near max)."""
    dtype = compute
    big = float(torch.finfo(dtype).max) / 2
    x = torch.tensor([[0.64, -0.82, 0.05, -0.004], [0.3, -1.1, 0.7, 0.2]], dtype=dtype)
    w = torch.tensor([0.34, -2.83, 2.63, 0.59], dtype=dtype)
    dy = torch.tensor([[big, big, -big, 0.5], [1.0, -0.5, 0.25, 2.0]], dtype=dtype)
    args = {"x": x, "weight": w, "eps": 1e-12}
    exact = oracle.vjp("rms_norm", (dy,), path="mpmath", **args)
    bounds = rms_norm_bwd(args, (dy,), exact)
    assert (bounds["x"][0] == -np.inf).all()
    assert np.isfinite(bounds["x"][1]).all() and (bounds["x"][1] > 0).all()
    assert not np.isnan(bounds["weight"]).any()
