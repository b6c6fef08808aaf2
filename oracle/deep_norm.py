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
"""
from __future__ import annotations

import numpy as np

from .layer_norm import affine_grads, normalize, normalize_vjp


def _affine(B, x, mat, alpha, shift):
    """alpha * x_i + sum_j mat_ij x_j + shift_i for every row, each an exact dot."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    xs = x.reshape(-1, 1, n)
    rows = xs.shape[0]
    coeffs = np.broadcast_to(mat, (rows, n, n))
    ones = np.ones((rows, n, 1))
    a = np.concatenate([coeffs, ones * alpha, ones * shift.reshape(1, n, 1)], axis=-1)
    b = np.concatenate([np.broadcast_to(xs, (rows, n, n)), x.reshape(-1, n)[:, :, None], ones], axis=-1)
    return B.row_dot(a, b).reshape(lead + (n,))


def forward(B, x, sub_weight, sub_bias, alpha, weight, bias, eps):
    z = _affine(B, x, sub_weight, alpha, sub_bias)
    xhat, _ = normalize(B, z, eps)
    return (xhat * weight + bias,)


def vjp(B, cot, x, sub_weight, sub_bias, alpha, weight, bias, eps):
    (dy,) = cot
    z = _affine(B, x, sub_weight, alpha, sub_bias)
    xhat, rho = normalize(B, z, eps)
    dz = normalize_vjp(B, xhat, rho, dy * weight)
    dw, db = affine_grads(B, xhat, dy)
    dx = _affine(B, dz, sub_weight.T, alpha, np.zeros(x.shape[-1]))
    return {"x": dx, "weight": dw, "bias": db}
