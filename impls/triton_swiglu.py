"""Triton kernels for SwiGLU and SiLU-and-mul, forward and backward.

The maths is ``oracle/swiglu.py``'s:

    sigma(g) = 1 / (1 + exp(-g)),   1 - sigma(g) = 1 / (1 + exp(g))
    y        = g * sigma(g) * u
    dgate    = dy * u * sigma(g) * (1 + g * (1 - sigma(g)))
    dup      = dy * g * sigma(g)

Both sigmoids are evaluated from e = exp(-|g|) <= 1, which never overflows:

    sigma = 1 / (1 + e),  1 - sigma = e / (1 + e)      for g >= 0 (swap them for g < 0)

so neither suffers cancellation, and for g << 0 sigma keeps its tiny value
(down to the subnormals) instead of dividing by an overflowed exp(-g) -- which
matters in dgate, where sigma is multiplied by 1 + g (1 - sigma) ~ g.

silu_and_mul(x) is swiglu on the two halves of x's last dim, passed to the
same kernels as two strided views of x; its gradient is written into the two
halves of one buffer.  Evaluated in IEEE arithmetic, silu(-inf) = -inf * 0 =
NaN, as the oracle has it.

Numerics and layout as in ``triton_norms``: inputs widened exactly to the
compute precision (float64 for float64, else float32), divisions rounded to
nearest, one rounding per output, any 2-D strides, tiles of BLOCK_R rows x
BLOCK_N columns.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import make
from .triton_norms import as_rows, compute_dtype, div_rn, tile, tile_ptrs


@triton.jit
def _tile_mask(rows, n, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """(row, col, mask) of this program's tile."""
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return row, col, (row < rows)[:, None] & (col < n)[None, :]


@triton.jit
def sigmoids(g):
    """(sigma(g), 1 - sigma(g)) from e = exp(-|g|); IEEE at +-inf (sigma = 1, 0) and NaN."""
    e = tl.exp(-tl.abs(g))
    big = div_rn(1.0, 1 + e)
    small = div_rn(e, 1 + e)
    return tl.where(g >= 0, big, small), tl.where(g >= 0, small, big)


@triton.jit
def _swiglu_fwd_kernel(
    G, sgr, sgc, U, sur, suc, Y, rows, n,
    ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y = g * sigma(g) * u, elementwise."""
    row, col, m = _tile_mask(rows, n, BLOCK_R, BLOCK_N)
    g = tl.load(tile_ptrs(G, row, col, sgr, sgc), mask=m, other=0.0).to(ACC)
    u = tl.load(tile_ptrs(U, row, col, sur, suc), mask=m, other=0.0).to(ACC)
    sigma, _ = sigmoids(g)
    tl.store(tile_ptrs(Y, row, col, n, 1), (g * sigma * u).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _swiglu_bwd_kernel(
    G, sgr, sgc, U, sur, suc, DY, sdr, sdc, DG, DU, sor, rows, n,
    ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dgate = dy u sigma (1 + g (1 - sigma)), dup = dy g sigma; DG and DU have row stride sor."""
    row, col, m = _tile_mask(rows, n, BLOCK_R, BLOCK_N)
    g = tl.load(tile_ptrs(G, row, col, sgr, sgc), mask=m, other=0.0).to(ACC)
    u = tl.load(tile_ptrs(U, row, col, sur, suc), mask=m, other=0.0).to(ACC)
    dy = tl.load(tile_ptrs(DY, row, col, sdr, sdc), mask=m, other=0.0).to(ACC)
    sigma, one_minus_sigma = sigmoids(g)
    dg = dy * u * sigma * (1 + g * one_minus_sigma)
    tl.store(tile_ptrs(DG, row, col, sor, 1), dg.to(DG.dtype.element_ty), mask=m)
    tl.store(tile_ptrs(DU, row, col, sor, 1), (dy * g * sigma).to(DU.dtype.element_ty), mask=m)


def _grid(rows, n):
    block_r, block_n = tile(n)
    return (triton.cdiv(rows, block_r), triton.cdiv(n, block_n)), block_r, block_n


def _forward(g2, u2):
    """y (rows, n) for 2-D gate and up of the same shape (any strides)."""
    rows, n = g2.shape
    y = torch.empty((rows, n), dtype=g2.dtype, device=g2.device)
    if rows * n:
        grid, block_r, block_n = _grid(rows, n)
        _swiglu_fwd_kernel[grid](g2, g2.stride(0), g2.stride(1), u2, u2.stride(0), u2.stride(1), y, rows, n,
                                 ACC=compute_dtype(g2.dtype)[0], BLOCK_R=block_r, BLOCK_N=block_n)
    return y


def _backward(g2, u2, dy2, dg2, du2):
    """Write dgate into dg2 and dup into du2 (2-D, unit column stride, one row stride)."""
    rows, n = g2.shape
    if rows * n:
        grid, block_r, block_n = _grid(rows, n)
        _swiglu_bwd_kernel[grid](g2, g2.stride(0), g2.stride(1), u2, u2.stride(0), u2.stride(1),
                                 dy2, dy2.stride(0), dy2.stride(1), dg2, du2, dg2.stride(0), rows, n,
                                 ACC=compute_dtype(g2.dtype)[0], BLOCK_R=block_r, BLOCK_N=block_n)


class Gated(torch.autograd.Function):
    """y = act(gate) * up for 2-D-viewable gate and up, by ``fwd(g2, u2, *extra) -> y2`` and
    ``bwd(g2, u2, dy2, dg2, du2, *extra)`` (which writes dgate and dup): SwiGLU's kernels here,
    GeGLU's in ``triton_geglu`` (``extra``: its form)."""

    @staticmethod
    def forward(ctx, gate, up, fwd, bwd, *extra):
        ctx.save_for_backward(gate, up)
        ctx.bwd, ctx.extra = bwd, extra
        n = gate.shape[-1]
        return fwd(as_rows(gate, n), as_rows(up, n), *extra).reshape(gate.shape)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        n = gate.shape[-1]
        dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        dup = torch.empty(up.shape, dtype=up.dtype, device=up.device)
        ctx.bwd(as_rows(gate, n), as_rows(up, n), as_rows(dy, n), as_rows(dgate, n), as_rows(dup, n), *ctx.extra)
        return (dgate, dup, None, None) + (None,) * len(ctx.extra)


def _halves(x2):
    h = x2.shape[1] // 2
    return x2[:, :h], x2[:, h:]


class GatedHalves(torch.autograd.Function):
    """``Gated`` on the two halves of x's last dim [gate | up], passed to the kernels as two strided
    views of x; the gradient is written into the two halves of one buffer."""

    @staticmethod
    def forward(ctx, x, fwd, bwd, *extra):
        ctx.save_for_backward(x)
        ctx.bwd, ctx.extra = bwd, extra
        x2 = as_rows(x, x.shape[-1])
        return fwd(*_halves(x2), *extra).reshape(x.shape[:-1] + (x.shape[-1] // 2,))

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        x2 = as_rows(x, x.shape[-1])
        dx = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        ctx.bwd(*_halves(x2), as_rows(dy, dy.shape[-1]), *_halves(dx), *ctx.extra)
        return (dx.reshape(x.shape), None, None) + (None,) * len(ctx.extra)


def swiglu(gate, up):
    return Gated.apply(gate, up, _forward, _backward)


def silu_and_mul(x):
    return GatedHalves.apply(x, _forward, _backward)


IMPLS = [
    make("swiglu", "triton", "triton", swiglu, devices=("cpu", "cuda")),
    make("silu_and_mul", "triton", "triton", silu_and_mul, devices=("cpu", "cuda")),
]
