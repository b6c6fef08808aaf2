"""A Triton kernel written the way users write one, for the meta-tests (imported only where Triton is).

``rms_norm_plain`` is a forward-only RMSNorm as found in inference repos: one
program per row, loads widened with ``.to(tl.float32)``, the row normalised in
float32 and rounded to the input's dtype, then **one multiply by the weight in
that dtype** (bf16 × bf16 on bf16 inputs, the Llama/HF order), and a plain
store.  No bit tricks: on CPU it is certified in bfloat16 only because normcert
makes Triton's interpreter compute bfloat16 as a GPU does.  Its float64 path
computes in float64 (ACC) but receives eps as Triton passes every Python float,
an fp32 scalar: wrong in float64, as on a GPU.

``rms_norm_int32_offsets`` is the same kernel with its row offset in int32, for
``--profile large`` on a GPU (test_meta).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_rows(X, W, Y, n, eps, ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    x = tl.load(X + row * n + cols, mask=inside, other=0.0).to(ACC)
    rstd = 1 / tl.sqrt(tl.sum(x * x, 0) / n + eps)
    normed = (x * rstd).to(Y.dtype.element_ty)
    y = normed * tl.load(W + cols, mask=inside, other=0.0)
    tl.store(Y + row * n + cols, y, mask=inside)


def rms_norm_plain(x, weight, eps):
    n = x.shape[-1]
    rows = x.reshape(-1, n).contiguous()
    out = torch.empty_like(rows)
    if out.numel():
        acc = tl.float64 if x.dtype == torch.float64 else tl.float32
        _rms_norm_rows[(rows.shape[0],)](rows, weight.contiguous(), out, n, eps, ACC=acc,
                                         BLOCK=triton.next_power_of_2(n))
    return out.reshape(x.shape)


@triton.jit
def _rms_norm_rows_int32(X, W, Y, sx, n, eps, ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # int32, as it comes: row * sx wraps past 2**31 elements
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    x = tl.load(X + row * sx + cols, mask=inside, other=0.0).to(ACC)
    rstd = 1 / tl.sqrt(tl.sum(x * x, 0) / n + eps)
    y = (x * rstd).to(Y.dtype.element_ty) * tl.load(W + cols, mask=inside, other=0.0)
    tl.store(Y + row * n + cols, y, mask=inside)


def rms_norm_int32_offsets(x, weight, eps):
    """``rms_norm_plain`` reading x through its row stride with the row offset in int32 (the
    FlashInfer#3005 pattern): right below 2**31 elements, wrong past them (--profile large)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        acc = tl.float64 if x.dtype == torch.float64 else tl.float32
        _rms_norm_rows_int32[(rows.shape[0],)](rows, weight.contiguous(), out, rows.stride(0), n, eps, ACC=acc,
                                               BLOCK=triton.next_power_of_2(n))
    return out.reshape(x.shape)
