"""Gemma's RMSNorm: the weight is stored as an offset from 1 (Gemma 1-3, Qwen3-Next).

Per row (last dim, length n), with stored weight w:

    rho  = 1 / sqrt((1/n) sum_j x_j**2 + eps)
    y_i  = x_i * rho * (1 + w_i)                           gemma_rms_norm(x, w, eps)

that is rms_norm(x, 1 + w, eps), the offset added exactly (a kernel adds it
in its compute format; the error model charges that one rounding).

Vector-Jacobian product for cotangent dy: rms_norm's at weight 1 + w,

    dx_i = rho (g_i - xhat_i mean(g xhat)),  g = dy (1 + w),  xhat = x rho
    dw_i = sum_over_rows dy_i x_i rho          (d(1 + w)/dw = 1)

Non-finite inputs: as rms_norm.
"""
from __future__ import annotations

from . import rms_norm


def forward(B, x, weight, eps):
    return rms_norm.forward(B, x, 1 + weight, eps)


def vjp(B, cot, x, weight, eps):
    return rms_norm.vjp(B, cot, x, 1 + weight, eps)
