"""The float64 oracle's filters against the pure mpmath path, bit for bit, on adversarial inputs.

* ``float64_backend.proven_overflow`` (SwiGLU's ``overflows``): every element the float64 path
  leaves at ±inf is the mpmath path's value, forward and VJP, on products within an ulp of the
  overflow threshold 2**1024 - 2**970 (either side), gates at the filter's edges (0, 45), huge,
  tiny, subnormal, signed zero, inf and NaN; and the filter does decide most of the clear cases.
* ``oracle._resolve`` skips the elements with no claim for an exact kernel (bound -inf): each has
  no claim for a kernel either (bound -inf with kernel=True, against the exact scale and against
  a kernel's), and every claimed element rounds to the format as the mpmath path's does.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from ... import oracle
from ...oracle.backends import F64, MP
from ...oracle.bounds_quant import rescaled
from ...oracle.float64_backend import proven_overflow
from ...oracle.formats import fmt
from ...oracle.fp4 import divisor, rounding
from ...oracle.swiglu import _sigma_low

T = mpmath.mpf(2) ** 1024 - mpmath.mpf(2) ** 970  # float64's round-to-nearest overflow threshold (a real)
GATES = [0.0, -0.0, 2.0 ** -1074, 1e-300, 0.5, 1.0, 1.5, 2.0, 3.0, 10.0, 44.99, 45.0, 45.01, 700.0, 1e10,
         1e200, 2.0 ** 1023, -0.5, -1.0, -44.99, -45.0, -745.5, -1e200]


def _sigma(g):
    return 1 / (1 + mpmath.exp(-mpmath.mpf(g)))


def _near(s) -> list[float]:
    """Values u for which |s u| (s an exact real) lies within a few ulps of T, on both sides."""
    with mpmath.workprec(256):
        if not s or abs(T / s) > 2.0 ** 1023:
            return []
        out = [float(abs(T / s))]
    for _ in range(12):
        out = [np.nextafter(out[0], -np.inf)] + out + [np.nextafter(out[-1], np.inf)]
    return out


def _near_threshold(g: float) -> list[float]:
    """Up values u whose exact |silu(g) u| lies within a few ulps of T, on both sides."""
    with mpmath.workprec(256):
        return _near(g * _sigma(g))


def _cases():
    g, u = [], []
    specials = [0.0, -0.0, 2.0 ** -1074, 1.0, 1e200, -1e200, 2.0 ** 1023, -(2.0 ** 1023), np.inf, -np.inf, np.nan]
    for gate in GATES + [np.inf, -np.inf, np.nan]:
        for up in specials + _near_threshold(gate) + [-v for v in _near_threshold(gate)]:
            g.append(gate)
            u.append(up)
            g.append(-gate)
            u.append(up)
    return np.array(g), np.array(u)


def _bits_equal(a, b) -> np.ndarray:
    return (np.asarray(a, np.float64).view(np.int64) == np.asarray(b, np.float64).view(np.int64)) | (
        np.isnan(a) & np.isnan(b))


def test_dgate_overflow_filter_agrees_with_mpmath_bit_for_bit():
    """dgate = d u silu'(g) with u = 1e300 and d within ulps of T / (u silu'(g)), either sign."""
    g, d = [], []
    for gate in GATES:
        with mpmath.workprec(256):
            ds = _sigma(gate) * (1 + gate * (1 - _sigma(gate)))
            near = _near(ds * mpmath.mpf(1e300))
        g += [gate] * 2 * len(near)
        d += near + [-v for v in near]
    g, d = np.array(g), np.array(d)
    x = torch.from_numpy(np.stack([g, np.full(g.shape, 1e300)]))
    gf = oracle.vjp("swiglu", (torch.from_numpy(d),), gate=x[0], up=x[1])["gate"]
    gm = oracle.vjp("swiglu", (torch.from_numpy(d),), path="mpmath", gate=x[0], up=x[1])["gate"]
    assert np.isinf(gm).any() and np.isfinite(gm).any()
    assert _bits_equal(gf[np.isinf(gf)], gm[np.isinf(gf)]).all()


def test_silu_overflow_filter_agrees_with_mpmath_bit_for_bit():
    g, u = _cases()
    d = np.where(np.arange(g.size) % 2, 1.0, -3.0)  # a cotangent of either sign, |d| > 1 too
    x = torch.from_numpy(np.stack([g, u]))
    f64 = oracle.forward("swiglu", gate=x[0], up=x[1])[0]
    mp = oracle.forward("swiglu", path="mpmath", gate=x[0], up=x[1])[0]
    inf = np.isinf(f64)
    assert _bits_equal(f64[inf], mp[inf]).all()
    cot = (torch.from_numpy(d),)
    gf = oracle.vjp("swiglu", cot, gate=x[0], up=x[1])
    gm = oracle.vjp("swiglu", cot, path="mpmath", gate=x[0], up=x[1])
    for k in ("gate", "up"):
        at = np.isinf(gf[k])
        assert _bits_equal(gf[k][at], gm[k][at]).all(), k
    with np.errstate(all="ignore"):  # the filter decides the clear overflows, not only the far ones
        decided = proven_overflow(g / (1 + np.exp(-g)) * u, _sigma_low(g), g, u)  # float64's silu(g) u
    assert decided.sum() >= 20
    assert _bits_equal(f64[decided], mp[decided]).all()
    assert not (decided & ~np.isinf(mp)).any()


def test_the_filter_refuses_what_it_cannot_prove():
    """Just past T (by less than the filter's 2**-46 margin) the exact value does round to inf, but
    the filter leaves it to mpmath; a product a few ulps below T, finite, is never called inf."""
    g = np.array([1e300, 1e300, 50.0])
    with np.errstate(over="ignore"):
        out = np.full(3, np.inf)
    u0 = float(T / mpmath.mpf(1e300))
    u = np.array([np.nextafter(u0, np.inf), np.nextafter(u0, -np.inf) * (1 - 2.0 ** -50), 1.0])
    assert not proven_overflow(out, _sigma_low(g), g, u).any()
    assert proven_overflow(np.array([np.inf, -np.inf]), np.array([1 - 2.0 ** -52] * 2),
                           np.array([1e300, -1e300]), np.array([1e10, 1e10])).all()
    assert not proven_overflow(np.array([-np.inf]), np.array([1.0]), np.array([1e300]), np.array([1e10])).any()


def _group_cases(dtype):
    rng = np.random.default_rng(5)
    big = 1e200 if dtype == torch.float64 else 3e38
    x = rng.standard_normal((6, 128)) * np.array([1.0, big, 1e-300, 1.0, big, 1.0])[:, None]
    x[3, 5] = np.inf  # up inf at a gate: an indeterminate element
    x[3, 64 + 5] = np.inf
    x[3, 7] = -800.0  # silu flushed to 0 times inf up
    x[3, 64 + 7] = np.inf
    x[5, 9] = np.nan
    return torch.from_numpy(x).to(dtype)


@pytest.mark.parametrize("x_dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("nan", [None, "ignore", "unspecified"])
def test_rows_left_unresolved_have_no_claim_and_the_rest_match_mpmath(x_dtype, nan):
    rec = oracle.OPS["silu_and_mul_group_quant"]
    args = dict(rec.sample(x_dtype, "cpu"), x=_group_cases(x_dtype), group=16, nan=nan)
    y, s = oracle.forward(rec.name, **args)
    ym, _ = oracle.forward(rec.name, path="mpmath", **args)
    oracle_bound = rec.forward_bound(args, (y, s), kernel=False)[0]
    free = oracle_bound == -np.inf
    assert free.any()
    kernel_scale = s.astype(np.float32).astype(np.float64)
    for kw in ({}, {"kernel_scale": kernel_scale}):
        assert (rec.forward_bound(args, (y, s), **kw)[0][free] == -np.inf).all()
    f = fmt(torch.float8_e4m3fn)
    claimed = ~free & np.isfinite(y)
    a, b = f.round(y[claimed]), f.round(ym[claimed])
    assert ((a == b) | np.isnan(a) & np.isnan(b)).all()  # as ``assess`` reads a quantised value: -0 == 0


def _fp4_rows(op: str, dtype, g: float) -> torch.Tensor:
    """Rows whose block scales underflow E4M3 (s_lo = 0: y's own bound +inf), sit at its smallest
    steps, or are ordinary, in blocks of one magnitude each."""
    rng = np.random.default_rng(11)
    n = 128 if op.startswith("silu") else 64
    edge = 6 * g * 2.0 ** -10  # a block peak whose scale A / (6 g) is E4M3's least subnormal's half
    mags = np.array([1e-3, 1.0, edge, edge * 2, edge * 3.01, 0.02, 50.0, 1e-6])
    x = rng.standard_normal((len(mags), n)) * mags[:, None]
    if op.startswith("silu"):  # v = silu(g) u: gates about 1, the magnitude in up
        x[:, : n // 2] = 1.0 + 0.1 * rng.standard_normal((len(mags), n // 2))
    else:  # a row of mean square 1 (with eps 1e-30: rho = 1 - 5e-31, float64's 1): its block of peak 6
        tie = np.zeros(n)  # has S = 1 and y = 3.5 rho just below E2M1's tie of 3 and 4, which float64 rounds up
        tie[:20] = [6.0, 3.5, 0.5, 0.5, 0.5] + [1.0] * 15
        x = np.vstack([x, tie / g])  # over g: rho is g (1 - 5e-31), A = 6, S = 1 / g, exact in E4M3 for g = 1, 2^-5
    return torch.from_numpy(x).to(dtype)


@pytest.mark.parametrize("op", ["silu_and_mul_fp4_quant", "rms_norm_fp4_quant"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_fp4_rows_left_unresolved_for_an_unbounded_y_are_checked_as_mpmath_s(op, x_dtype):
    """``oracle._resolve`` leaves the rows whose only near elements have an infinite y bound: there
    a check that compares y as it is has no claim (the kernel's bound is infinite too); one that holds
    it against the kernel's scale (``measure.oracle_assessments``) reads w = y S / s_k, which is
    within its bound of the mpmath path's w (bit for bit where the bound is 0); and every element
    with a finite bound of its own rounds to E2M1 as the mpmath path's does."""
    rec = oracle.OPS[op]
    skipped_any = tied = False
    for g in (1.0, 0.375, 2.0 ** -5, 11 / 8192, 3.0):
        args = dict(rec.sample(x_dtype, "cpu"), x=_fp4_rows(op, x_dtype, g), global_scale=g)
        if "weight" in args:
            args.update(weight=torch.ones(args["x"].shape[-1], dtype=x_dtype), eps=1e-30)
        y, s = oracle.forward(op, **args)
        ym, sm = oracle.forward(op, path="mpmath", **args)
        own = rec.forward_bound(args, (y, s), kernel=False)[0]
        unbounded = own == np.inf
        skipped_any |= bool(unbounded.any())
        assert np.isinf(rec.forward_bound(args, (y, s))[0][unbounded]).all()
        e2m1, form, block = rec.quantised_format("y"), rounding(args, "block_format"), rec.group_size(rec.outs[1], args)
        finite = np.isfinite(own) & np.isfinite(y)
        near = finite & (e2m1.round(y - own) != e2m1.round(y + own))
        assert (e2m1.round(y[finite & ~near]) == e2m1.round(ym[finite & ~near])).all()
        assert _bits_equal(y[near], ym[near]).all()  # resolved: the mpmath path's own values
        tied |= bool(near.any())
        for ks in (divisor(sm, form), divisor(sm, form) * 2, np.zeros_like(sm)):  # a right scale, one off, 0
            b = rec.forward_bound(args, (y, s), kernel_scale=ks)[0]
            w, wm = rescaled(y, divisor(s, form), ks, block), rescaled(ym, divisor(sm, form), ks, block)
            held = np.isfinite(b) & (b >= 0) & np.isfinite(w)
            assert _bits_equal(w[held & (b == 0)], wm[held & (b == 0)]).all()
            assert (np.abs(w - wm)[held] <= b[held]).all()
    assert skipped_any and (tied or op.startswith("silu"))  # the tie row rounded otherwise by float64
