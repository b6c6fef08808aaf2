"""DeepNorm (post-norm residual with up-weighted skip), DeepNet 2022.

    z = alpha * x + sublayer(x)
    y = layer_norm(z, w, b, eps)

The suite's sublayers are affine maps, sublayer(x) = x @ A^T + c with A of
shape (n, n) and c of shape (n,), so the oracle evaluates z exactly:
z_i = alpha x_i + sum_j A_ij x_j + c_i, one exactly rounded dot product per
element.  DeepNet's beta scales the *initialisation* of the sublayer's
weights; it never multiplies the sublayer's input.  A kernel that computes
sublayer(beta * x) computes a different function.

Vector-Jacobian product: dz = layer_norm's dx at z; then

    dx_j = alpha dz_j + sum_i dz_i A_ij,     dw, db as layer_norm at z.

Non-finite values: as layer_norm, row by row (A mixes only within a row).

Overflow: z may exceed float64's range where x is near it, though y is
finite.  layer_norm is invariant under (z, eps) -> (c z, c**2 eps), so rows
where z could overflow are evaluated at c x (c = 2**-k, chosen from a bound on
|z|) with c**2 eps; c = 1 everywhere else.
"""
from __future__ import annotations

import numpy as np

from .layer_norm import affine_grads, normalize, normalize_vjp


def _affine(B, x, mat, alpha, shift):
    """alpha * x_i + sum_j mat_ij x_j + shift_i for every row (shift: (n,) or one per row), each an exact dot."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    xs = x.reshape(-1, 1, n)
    rows = xs.shape[0]
    coeffs = np.broadcast_to(mat, (rows, n, n))
    ones = np.ones((rows, n, 1))
    shift = np.broadcast_to(shift, lead + (n,)).reshape(rows, n, 1)  # per row where scaled
    a = np.concatenate([coeffs, ones * alpha, shift], axis=-1)
    b = np.concatenate([np.broadcast_to(xs, (rows, n, n)), x.reshape(-1, n)[:, :, None], ones], axis=-1)
    return B.row_dot(a, b).reshape(lead + (n,))


def _scaled_normalize(B, x, sub_weight, sub_bias, alpha, eps):
    """normalize(z) as (xhat, rho, c), evaluated at c z (c = 2**-k per row, |c z| < 2**1000)."""
    af, cf = B.to_float64(sub_weight), B.to_float64(sub_bias)
    with np.errstate(all="ignore"):
        peak = B.row_peak(x)
        peak = np.where(np.isfinite(peak), peak, 0.0)  # a non-finite row is NaN whatever c is
        gain = abs(alpha) + np.abs(af).sum(axis=-1).max(initial=0.0)
        bound = gain * (peak * 2.0 ** -1000) + np.abs(cf).max(initial=0.0) * 2.0 ** -1000  # |z| / 2**1000
        _, e = np.frexp(np.where(np.isfinite(bound), bound, 0.0))
        c = np.ldexp(1.0, -np.maximum(e, 0))
    z = _affine(B, x * c, sub_weight, alpha, sub_bias * c)
    xhat, rho, c2 = normalize(B, z, eps * c * c)
    return xhat, rho, c * c2


def forward(B, x, sub_weight, sub_bias, alpha, weight, bias, eps):
    xhat, _, _ = _scaled_normalize(B, x, sub_weight, sub_bias, alpha, eps)
    return (B.mul_add_(xhat, weight, bias),)


def vjp(B, cot, x, sub_weight, sub_bias, alpha, weight, bias, eps):
    (dy,) = cot
    xhat, rho, c = _scaled_normalize(B, x, sub_weight, sub_bias, alpha, eps)
    dz = normalize_vjp(B, xhat, rho, c, dy * weight)
    dw, db = affine_grads(B, xhat, dy)
    dx = _affine(B, dz, sub_weight.T, alpha, np.zeros(x.shape[-1]))
    return {"x": dx, "weight": dw, "bias": db}


def affine_sublayer(weight, bias):
    """The sublayer the suite hands a deep_norm kernel: t -> t @ weight.T + bias, rounded once to t's dtype.

    A fixture, not part of the kernel under test, so it is made as exact as it can be and the
    bounds charge the kernel for its own arithmetic only.  It computes in float64 and rounds once:
    for float32, float16 and bfloat16 t every product of t and weight is exact in float64 and the
    n-term sum errs by at most gam_64(n + 1) sum_j |t_j A_ij| + |c_i|, so the result is t's dtype's
    rounding of the exact value but for that (``bounds_norms._deep_z``); for float64 t it is a
    float64 matmul, as a float64 kernel's would be.  Autograd through it is the same: the incoming
    gradient is widened to float64 exactly, multiplied by weight in float64, and rounded once back.
    (Before, it computed in float32 with torch's blocked matmul, and the bounds carried a float32
    gam(n + 2) for it: the fixture's error, charged to the kernel.)  Not F.linear in bfloat16
    directly: on CPU (torch 2.13) that leaks NaN/inf from one row of t into the outputs of other
    rows, which would blame the kernel for the sublayer.  t is made contiguous first: cuBLAS takes
    row strides below 2**31 only (an H100, torch 2.11, refused a float32 t with row stride
    2**31 + 128: --profile large).
    """
    import torch.nn.functional as F  # noqa: PLC0415 - the maths above is backend-generic; the sublayer is torch

    def sublayer(t):
        return F.linear(t.double().contiguous(), weight.double(), bias.double()).to(t.dtype)

    return sublayer
