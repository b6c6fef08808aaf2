"""Triton kernels for GeGLU and GELU-and-mul, forward and backward, in GELU's two forms.

The maths is ``oracle/geglu.py``'s.  With gelu(g) = g h(g):

    erf  ("none"):  h = (1 + erf(g / sqrt 2)) / 2,   h' = e**(-g**2 / 2) / sqrt(2 pi)
    tanh:           h = sigma(2 t),  2 t = g (C1 + C3 g**2),  C1 = 2 sqrt(2 / pi), C3 = 0.044715 C1
                    h' = 2 sigma(2 t) sigma(-2 t) t',  t' = (C1 + 3 C3 g**2) / 2
    y     = g h u
    dgate = dy u (h + g h'),   dup = dy g h

The tanh form takes sigma from e = exp(-|2 t|) <= 1, as ``triton_swiglu`` does, so neither
sigma(2 t) nor sigma(-2 t) cancels and nothing overflows (g**3 may: then |2 t| = inf, e = 0).
In IEEE arithmetic gelu(+inf) = inf * 1 = inf and gelu(-inf) = -inf * 0 = NaN, as the oracle has it.

The constants are loaded from a small tensor in the compute precision (``_constants``): a
Python float in a kernel would be a float32 constant, 2**-24 off for a float64 kernel.

Layout and numerics as in ``triton_swiglu`` (whose tiles and helpers these kernels share).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..oracle.kinds import APPROXIMATE
from ..oracle.validate import one_of

from . import make
from .triton_norms import compute_dtype, div_rn, tile_ptrs
from .triton_swiglu import Gated, GatedHalves, _grid, _tile_mask



def _constants(dtype, device) -> torch.Tensor:
    """[1 / sqrt 2, 1 / sqrt(2 pi), C1, C3], each rounded once to dtype (torch rounds from float64;
    for a float64 kernel the float64 values themselves)."""
    c1 = 2 * math.sqrt(2 / math.pi)
    return torch.tensor([math.sqrt(0.5), 1 / math.sqrt(2 * math.pi), c1, 0.044715 * c1], dtype=torch.float64,
                        device=device).to(dtype)


@triton.jit
def _gelu_h(g, C, TANH: tl.constexpr):
    """(h, h') with gelu(g) = g h, gelu'(g) = h + g h'."""
    if TANH:
        c1 = tl.load(C + 2)
        c3 = tl.load(C + 3)
        t2 = g * (c1 + c3 * (g * g))
        e = tl.exp(-tl.abs(t2))
        big = div_rn(1.0, 1 + e)
        small = div_rn(e, 1 + e)
        s = tl.where(t2 >= 0, big, small)
        sm = tl.where(t2 >= 0, small, big)
        return s, s * sm * (c1 + 3 * c3 * (g * g))
    else:
        h = 0.5 * (1 + tl.math.erf(g * tl.load(C)))
        return h, tl.load(C + 1) * tl.exp(-0.5 * (g * g))


@triton.jit
def _geglu_fwd_kernel(
    G, sgr, sgc, U, sur, suc, Y, C, rows, n,
    TANH: tl.constexpr, ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y = g h(g) u, elementwise."""
    row, col, m = _tile_mask(rows, n, BLOCK_R, BLOCK_N)
    g = tl.load(tile_ptrs(G, row, col, sgr, sgc), mask=m, other=0.0).to(ACC)
    u = tl.load(tile_ptrs(U, row, col, sur, suc), mask=m, other=0.0).to(ACC)
    h, _ = _gelu_h(g, C, TANH)
    tl.store(tile_ptrs(Y, row, col, n, 1), (g * h * u).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _geglu_bwd_kernel(
    G, sgr, sgc, U, sur, suc, DY, sdr, sdc, DG, DU, sor, C, rows, n,
    TANH: tl.constexpr, ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dgate = dy u (h + g h'), dup = dy g h; DG and DU have row stride sor."""
    row, col, m = _tile_mask(rows, n, BLOCK_R, BLOCK_N)
    g = tl.load(tile_ptrs(G, row, col, sgr, sgc), mask=m, other=0.0).to(ACC)
    u = tl.load(tile_ptrs(U, row, col, sur, suc), mask=m, other=0.0).to(ACC)
    dy = tl.load(tile_ptrs(DY, row, col, sdr, sdc), mask=m, other=0.0).to(ACC)
    h, dh = _gelu_h(g, C, TANH)
    tl.store(tile_ptrs(DG, row, col, sor, 1), (dy * u * (h + g * dh)).to(DG.dtype.element_ty), mask=m)
    tl.store(tile_ptrs(DU, row, col, sor, 1), (dy * g * h).to(DU.dtype.element_ty), mask=m)


def _forward(g2, u2, approximate):
    """y (rows, n) for 2-D gate and up of the same shape (any strides)."""
    rows, n = g2.shape
    y = torch.empty((rows, n), dtype=g2.dtype, device=g2.device)
    if rows * n:
        acc, acc_t = compute_dtype(g2.dtype)
        grid, block_r, block_n = _grid(rows, n)
        _geglu_fwd_kernel[grid](g2, g2.stride(0), g2.stride(1), u2, u2.stride(0), u2.stride(1), y,
                                _constants(acc_t, g2.device), rows, n,
                                TANH=approximate == "tanh", ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)
    return y


def _backward(g2, u2, dy2, dg2, du2, approximate):
    """Write dgate into dg2 and dup into du2 (2-D, unit column stride, one row stride)."""
    rows, n = g2.shape
    if rows * n:
        acc, acc_t = compute_dtype(g2.dtype)
        grid, block_r, block_n = _grid(rows, n)
        _geglu_bwd_kernel[grid](g2, g2.stride(0), g2.stride(1), u2, u2.stride(0), u2.stride(1),
                                dy2, dy2.stride(0), dy2.stride(1), dg2, du2, dg2.stride(0),
                                _constants(acc_t, g2.device), rows, n,
                                TANH=approximate == "tanh", ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)


def geglu(gate, up, approximate):
    one_of("geglu", "approximate", approximate, APPROXIMATE)
    return Gated.apply(gate, up, _forward, _backward, approximate)


def gelu_and_mul(x, approximate):
    one_of("gelu_and_mul", "approximate", approximate, APPROXIMATE)
    return GatedHalves.apply(x, _forward, _backward, approximate)


IMPLS = [
    make("geglu", "triton", "triton", geglu, devices=("cpu", "cuda")),
    make("gelu_and_mul", "triton", "triton", gelu_and_mul, devices=("cpu", "cuda")),
]
