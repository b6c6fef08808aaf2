"""A Triton RMSNorm with two paths, for the coverage meta-test (imported only where Triton is).

``rms_norm_dispatched`` launches ``_rms_rows`` (one program per row) below ``BLOCKED_FROM`` rows
and ``_rms_blocked`` (``ROWS_PER_PROGRAM`` rows per program) from there on, as Liger's RMSNorm
takes its block kernels from 32,768 rows.  Both compute the same; no case normcert draws on CPU
has that many rows (the interpreter's cap is 1,025), so a certificate must name ``_rms_blocked``
as not reached.  ``_square`` is a helper both call: reached through ``_rms_rows``' source.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCKED_FROM = 32768
ROWS_PER_PROGRAM = 4


@triton.jit
def _square(x):
    return x * x


@triton.jit
def _rms_rows(X, W, Y, n, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    inside = cols < n
    x = tl.load(X + row * n + cols, mask=inside, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(_square(x), 0) / n + eps)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + row * n + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _rms_blocked(X, W, Y, rows, n, eps, BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr):
    cols = tl.arange(0, BLOCK_SIZE)
    inside = cols < n
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    for i in range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + i
        here = inside & (row < rows)
        x = tl.load(X + row * n + cols, mask=here, other=0.0).to(tl.float32)
        rstd = 1 / tl.sqrt(tl.sum(_square(x), 0) / n + eps)
        tl.store(Y + row * n + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=here)


def rms_norm_dispatched(x, weight, eps):
    """RMSNorm computed in float32 (so correct in float32, float16 and bfloat16, not in float64)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n).contiguous()
    out = torch.empty_like(rows)
    m = rows.shape[0]
    if out.numel():
        block = triton.next_power_of_2(n)
        if m < BLOCKED_FROM:
            _rms_rows[(m,)](rows, weight.contiguous(), out, n, eps, BLOCK_SIZE=block)
        else:
            _rms_blocked[(triton.cdiv(m, ROWS_PER_PROGRAM),)](rows, weight.contiguous(), out, m, n, eps,
                                                             BLOCK_SIZE=block, ROWS=ROWS_PER_PROGRAM)
    return out.reshape(x.shape)
