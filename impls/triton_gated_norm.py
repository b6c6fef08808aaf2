"""Triton kernels for the gated RMSNorm (``rms_norm_gated``), forward and backward.

The maths is ``oracle/rms_norm_gated.py``'s; per row of length n, with s = silu(z) = z sigma(z):

    norm_before_gate:      q = x,      y = q rho w s
    not norm_before_gate:  q = x s,    y = q rho w          rho = 1 / sqrt(mean(q^2) + eps)

and for a cotangent dy, with c the cotangent of rms_norm(q) (dy s, or dy) and h = c w:

    dq = rho (h - qhat mean(h qhat)),  qhat = q rho,   dw = sum_rows c qhat
    norm_before_gate:      dx = dq,     dz = dy qhat w silu'(z)
    not norm_before_gate:  dx = dq s,   dz = dq x silu'(z)

silu'(z) = sigma(z) (1 + z (1 - sigma(z))), both sigmoids from exp(-|z|) (``triton_swiglu.sigmoids``).

Groups (``group_size`` = G dividing n, None: G = n): every mean above is over the group J_j = {jG, ...,
jG + G - 1} holding the column, rho_j = 1 / sqrt((1/G) sum_{k in J_j} q_k^2 + eps), mean(h qhat) alike;
dw is still summed over the rows.  Each program owns one group of its rows (the grid's second axis,
j = program_id(1): columns jG + [0, G)), so a group's statistics never see another's columns, and
the backward's programs of one row chunk write disjoint columns of its dw partial row.

One forward kernel (two passes over a row: its mean square, then y) and one backward kernel (the
row's mean(h qhat), then dx, dz and this program's share of dw), as flash-linear-attention's and
Mamba's fused kernels are laid out; numerics, tiles and layout as ``triton_norms``'s: inputs widened
exactly to the compute precision, one rounding per output, rho from a square root and a division
each rounded to nearest, dw reduced in the compute precision through per-program partial sums.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..oracle.kinds import KINDS
from ..oracle.validate import boolean

from . import make
from .triton_norms import (MAX_PROGRAMS, add_to_partial, as_rows, column_sums, compute_dtype, div_rn, rsqrt_rn, scalar,
                           tile, tile_ptrs)
from .triton_swiglu import sigmoids


@triton.jit
def _load_gated(X, sxr, sxc, Z, szr, szc, row, col, m, NORM_FIRST: tl.constexpr, ACC: tl.constexpr):
    """(x, z, sigma(z), 1 - sigma(z), q) on the tile in ACC, q the rows normalised (0 where masked off)."""
    x = tl.load(tile_ptrs(X, row, col, sxr, sxc), mask=m, other=0.0).to(ACC)
    z = tl.load(tile_ptrs(Z, row, col, szr, szc), mask=m, other=0.0).to(ACC)
    sig, one_minus = sigmoids(z)
    q = x
    if not NORM_FIRST:
        q = tl.where(m, x * (z * sig), 0.0)
    return x, z, sig, one_minus, q


@triton.jit
def _gated_fwd_kernel(
    X, sxr, sxc, Z, szr, szc, W, EPS, Y, RSTD, rows, n, G,
    NORM_FIRST: tl.constexpr, ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y = q rho_j w (times silu(z) if NORM_FIRST) on group j = program_id(1) of each row; saves rho_j."""
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = tl.program_id(1)
    g0 = group * G
    in_rows = row < rows
    acc = tl.zeros([BLOCK_R, BLOCK_N], ACC)
    for c0 in range(0, G, BLOCK_N):
        in_group = c0 + tl.arange(0, BLOCK_N) < G
        col = g0 + c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & in_group[None, :]
        _, _, _, _, q = _load_gated(X, sxr, sxc, Z, szr, szc, row, col, m, NORM_FIRST, ACC)
        acc += q * q
    rstd = rsqrt_rn(div_rn(tl.sum(acc, 1), tl.full([], G, ACC)) + tl.load(EPS))
    tl.store(RSTD + row.to(tl.int64) * (n // G) + group, rstd, mask=in_rows)
    for c0 in range(0, G, BLOCK_N):
        in_group = c0 + tl.arange(0, BLOCK_N) < G
        col = g0 + c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & in_group[None, :]
        _, z, sig, _, q = _load_gated(X, sxr, sxc, Z, szr, szc, row, col, m, NORM_FIRST, ACC)
        w = tl.load(W + col, mask=in_group, other=0.0).to(ACC)
        y = q * rstd[:, None] * w[None, :]
        if NORM_FIRST:
            y = y * (z * sig)
        tl.store(tile_ptrs(Y, row, col, n, 1), y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _gated_bwd_kernel(
    X, sxr, sxc, Z, szr, szc, DY, sdr, sdc, W, RSTD, DX, DZ, DW_PART, rows, n, G, rows_per_prog,
    NORM_FIRST: tl.constexpr, ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dx, dz (module docstring) on group j = program_id(1) of rows_per_prog rows; their dw accumulates
    into the group's columns of row program_id(0) of DW_PART."""
    pid = tl.program_id(0)
    group = tl.program_id(1)
    g0 = group * G
    first = pid * rows_per_prog
    last = tl.minimum(first + rows_per_prog, rows)
    dw_part = DW_PART + pid.to(tl.int64) * n
    for r0 in range(first, last, BLOCK_R):
        row = r0 + tl.arange(0, BLOCK_R)
        in_rows = row < last
        rstd = tl.load(RSTD + row.to(tl.int64) * (n // G) + group, mask=in_rows, other=0)[:, None]
        sum_hq = tl.zeros([BLOCK_R, BLOCK_N], ACC)
        for c0 in range(0, G, BLOCK_N):
            in_group = c0 + tl.arange(0, BLOCK_N) < G
            col = g0 + c0 + tl.arange(0, BLOCK_N)
            m = in_rows[:, None] & in_group[None, :]
            _, z, sig, _, q = _load_gated(X, sxr, sxc, Z, szr, szc, row, col, m, NORM_FIRST, ACC)
            c = tl.load(tile_ptrs(DY, row, col, sdr, sdc), mask=m, other=0.0).to(ACC)
            if NORM_FIRST:
                c = c * (z * sig)
            w = tl.load(W + col, mask=in_group, other=0.0).to(ACC)
            sum_hq += tl.where(m, c * w[None, :] * (q * rstd), 0.0)
        mean_hq = div_rn(tl.sum(sum_hq, 1), tl.full([], G, ACC))[:, None]
        for c0 in range(0, G, BLOCK_N):
            in_cols = c0 + tl.arange(0, BLOCK_N) < G
            col = g0 + c0 + tl.arange(0, BLOCK_N)
            m = in_rows[:, None] & in_cols[None, :]
            x, z, sig, one_minus, q = _load_gated(X, sxr, sxc, Z, szr, szc, row, col, m, NORM_FIRST, ACC)
            dy = tl.load(tile_ptrs(DY, row, col, sdr, sdc), mask=m, other=0.0).to(ACC)
            w = tl.load(W + col, mask=in_cols, other=0.0).to(ACC)[None, :]
            s = z * sig
            slope = sig * (1 + z * one_minus)
            qhat = q * rstd
            if NORM_FIRST:
                c = dy * s
                dx = rstd * (c * w - qhat * mean_hq)
                dz = dy * (qhat * w) * slope
            else:
                c = dy
                dq = rstd * (c * w - qhat * mean_hq)
                dx = dq * s
                dz = dq * x * slope
            tl.store(tile_ptrs(DX, row, col, n, 1), dx.to(DX.dtype.element_ty), mask=m)
            tl.store(tile_ptrs(DZ, row, col, n, 1), dz.to(DZ.dtype.element_ty), mask=m)
            add_to_partial(dw_part, col, in_cols, tl.sum(tl.where(m, c * qhat, 0.0), 0))


class _GatedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, weight, eps, norm_first, group):
        n = x.shape[-1]
        acc, acc_t = compute_dtype(x.dtype)
        x2, z2 = as_rows(x, n), as_rows(z, n)
        rows = x2.shape[0]
        y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        rstd = torch.empty((rows, n // group if n else 0), dtype=acc_t, device=x.device)
        if rows * n:
            block_r, block_n = tile(group)
            _gated_fwd_kernel[(triton.cdiv(rows, block_r), n // group)](
                x2, x2.stride(0), x2.stride(1), z2, z2.stride(0), z2.stride(1), weight.contiguous(),
                scalar(eps, acc_t, x.device), y, rstd, rows, n, group,
                NORM_FIRST=norm_first, ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)
        ctx.save_for_backward(x, z, weight, rstd)
        ctx.norm_first, ctx.group = norm_first, group
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, z, weight, rstd = ctx.saved_tensors
        n = x.shape[-1]
        acc, acc_t = compute_dtype(x.dtype)
        x2, z2, dy2 = as_rows(x, n), as_rows(z, n), as_rows(dy, n)
        rows = x2.shape[0]
        dx = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        dz = torch.empty((rows, n), dtype=z.dtype, device=x.device)
        if rows * n == 0:
            return dx.reshape(x.shape), dz.reshape(z.shape), torch.zeros_like(weight), None, None, None
        block_r, block_n = tile(ctx.group)
        tiles = triton.cdiv(rows, block_r)
        rows_per_prog = triton.cdiv(tiles, min(tiles, MAX_PROGRAMS)) * block_r
        programs = triton.cdiv(rows, rows_per_prog)
        dw_part = torch.zeros((programs, n), dtype=acc_t, device=x.device)
        _gated_bwd_kernel[(programs, n // ctx.group)](
            x2, x2.stride(0), x2.stride(1), z2, z2.stride(0), z2.stride(1), dy2, dy2.stride(0), dy2.stride(1),
            weight.contiguous(), rstd, dx, dz, dw_part, rows, n, ctx.group, rows_per_prog,
            NORM_FIRST=ctx.norm_first, ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)
        return dx.reshape(x.shape), dz.reshape(z.shape), column_sums(dw_part, weight.dtype, acc), None, None, None


def rms_norm_gated(x, z, weight, eps, norm_before_gate, group_size=None):
    """The gated RMSNorm with its statistics per group of ``group_size`` consecutive elements of a row
    (None: the whole row), as the module docstring states it."""
    boolean("rms_norm_gated", "norm_before_gate", norm_before_gate)
    KINDS["group_size"].check("rms_norm_gated", "group_size", group_size, x)
    return _GatedRMSNorm.apply(x, z, weight, eps, norm_before_gate, x.shape[-1] if group_size is None else group_size)


IMPLS = [make("rms_norm_gated", "triton", "triton", rms_norm_gated, devices=("cpu", "cuda"))]
