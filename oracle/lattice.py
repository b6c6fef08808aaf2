r"""Rows that every correct order computes exactly, and the contract choice that claims them.

A contract choice (argument kind "arithmetic", ``ARITHMETICS``) of the FP4 ops:

    approximate  (the default) the error model's kernel (``error_model``): a reciprocal square root,
                 a reciprocal or a division good to FN_ULPS ulps of the compute format c, as PTX's
                 ``rsqrt.approx`` and ``rcp.approx`` are (Triton's ``rsqrt``, CUDA's ``rsqrtf``,
                 TensorRT-LLM's and FlashInfer's NVFP4 quantisers' ``rcp.approx.ftz``)
    ieee         every square root, division and reciprocal the kernel computes is correctly rounded
                 (IEEE 754: torch's CPU kernels, ``1 / sqrt`` and ``/`` in float32 without fast
                 math), so an operation whose exact result is representable returns it

Why the choice exists.  E2M1 rounded half away from zero differs from nearest-even only where
w = v / (s g) is exactly a tie (0.25, 1.25, 2.5, 5 round down to even; 0.75, 1.75, 3.5 round
up either way).  Under ``approximate`` no check can tell the two apart, on any input: take a
correct kernel whose reciprocal 1 / (s g) is one ulp high (r (1 + 2**(1-p)), inside FN_ULPS).  Where
v and s g are exact, v r is t (1 + 2**(1-p)) for a tie t, and t 2**(1-p) >= ulp(t) > ulp(t) / 2, so
the rounded product is strictly above t and nearest-even takes the neighbour away from zero: the
half-away kernel's bytes, element for element (on such rows an element off a tie is a lattice step
from one, so the one-ulp move does not carry it across; elsewhere the bound already admits both).  So the half-away kernel is certified under ``approximate``, rightly: its
bytes are a correct kernel's.  Under ``ieee`` the reciprocal is exact, and so is the whole chain on
the rows below: there y must be E2M1(w) itself, and the tie decides.

Exact rows (``exact_rms_rows``; rms_norm's v_i = x_i rho w_i, rho = 1 / sqrt(mean(x**2) + eps),
o = x's dtype, c its compute format, p_c c's significand bits).  A row is exact when

    1. n is a power of two;
    2. every x_i and x_i w_i is zero or a normal number of o (and so of c, which holds o), and
       every x_i**2 one of c (a kernel that flushes subnormals to zero moves none of them);
    3. with U the least significant bit among the row's nonzero x_i**2, T = sum x_i**2 < 2**p_c U:
       every x_i**2 is a multiple of U, so every partial sum, in any order and any tree, is a
       multiple of U below 2**p_c U, a number of c, and the sum is T exactly, whatever the order;
       the squares are each at least c's least normal, and so is every partial sum;
    4. T / n and each x_i**2 / n are normal numbers of c (n a power of two: the mean, as a division
       by n, a product with 1 / n or a sum of x_i**2 / n, is exact);
    5. eps is a number of c and m = T / n + eps is one, and m = 4**j: then sqrt(m) = 2**j and
       1 / sqrt(m) = 2**-j, each exact under ``ieee`` (a correctly rounded rsqrt gives it too);
    6. x_i 2**-j and v_i = x_i w_i 2**-j are zero or normal numbers of o: v is exact whether the
       kernel forms x rho w in c, rounds x rho to o first (vLLM, HF) or forms w rho first (a
       power of two times a number of o).

A fused row (add_rms_norm_fp4_quant) is the same test on s = x + r, with s a number of o: rounding
the sum to the residual stream's dtype (o, or float32) leaves it.

Then the FP4 check (``bounds_quant.block``) drops y's bound to 0 on the elements of an exact row whose
kernel scale s_k and global scale g are powers of two and whose v / s_k, v / g and w = v / (s_k g)
are zero or normal numbers of c: 1 / s_k, 1 / g and 1 / (s_k g) are then exact, and so is w in any
order of the divisions or reciprocals.  Nothing else changes: the scale keeps its bound (a kernel's
amax divided by 6 is not exact), and a row that fails any condition keeps the model's bound.
"""
from __future__ import annotations

import numpy as np

from .formats import Format, compute_format, fmt

ARITHMETICS = ("approximate", "ieee")  # the first the default


def normal_or_zero(a, f: Format) -> np.ndarray:
    """Each element of ``a`` (float64) zero, or a normal number of format ``f``."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(all="ignore"):
        finite = np.isfinite(a)
        safe = np.where(finite, a, 0.0)
        return finite & (f.round(safe) == safe) & ((safe == 0) | (np.abs(safe) >= f.lam))


def power_of_two(a) -> np.ndarray:
    """Each element of ``a`` a positive finite power of two."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(all="ignore"):
        m, _ = np.frexp(np.where(np.isfinite(a) & (a > 0), a, 3.0))
    return m == 0.5


def _least_bit(a: np.ndarray) -> np.ndarray:
    """The value of the least significant set bit of each positive float64 (inf for zero)."""
    m, e = np.frexp(a)
    ints = np.ldexp(m, 53).astype(np.int64)
    low = ints & -ints
    return np.where(a > 0, np.ldexp(low.astype(np.float64), e - 53), np.inf)


def exact_rms_rows(rows, weight, eps: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(ok, v): the rows (keepdims, bool) of rms_norm on ``rows`` (float64, x's dtype ``dtype``)
    with ``weight`` (float64, the row's length) and ``eps`` that every correct order computes
    exactly under ``arithmetic=ieee`` (module docstring, conditions 1-6), and v = x w 2**-j there
    (0 elsewhere), exact."""
    o, c = fmt(dtype), compute_format(dtype)
    rows = np.asarray(rows, dtype=np.float64)
    n = rows.shape[-1]
    shape = rows.shape[:-1] + (1,)
    if n == 0 or n & (n - 1) or not normal_or_zero(eps, c) or eps <= 0:
        return np.zeros(shape, bool), np.zeros_like(rows)
    with np.errstate(all="ignore"):
        sq = rows * rows
        xw = rows * weight
        ok = (normal_or_zero(rows, o) & normal_or_zero(xw, o) & normal_or_zero(sq, c)
              & normal_or_zero(sq / n, c)).all(-1, keepdims=True)
        unit = np.min(_least_bit(np.where(np.isfinite(sq), sq, 0.0)), axis=-1, keepdims=True)
        total = np.sum(np.where(ok, sq, 0.0), axis=-1, keepdims=True)
        ok &= total < np.ldexp(unit, c.p)
        mean = total / n
        m = mean + eps
        ok &= normal_or_zero(mean, c) & normal_or_zero(m, c) & power_of_two(m)
        _, e = np.frexp(np.where(ok, m, 1.0))
        ok &= (e - 1) % 2 == 0  # m = 4**j
        rho = np.ldexp(1.0, -((e - 1) // 2))
        v = xw * rho
        ok &= (normal_or_zero(rows * rho, o) & normal_or_zero(v, o)).all(-1, keepdims=True)
    return ok, np.where(ok, v, 0.0)


__all__ = ["ARITHMETICS", "exact_rms_rows", "normal_or_zero", "power_of_two"]
