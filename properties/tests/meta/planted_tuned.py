"""Autotuned Triton kernels, as most shipped norm kernels are, for the meta-tests.

Both are one program per row, the row reduced and normalised in float32 over blocks of
``BLOCK`` columns, ``BLOCK`` picked by ``@triton.autotune`` among 1024 (twice: ``num_warps``
4 and 8, one computation under the interpreter) and 32.  They declare float32, float16 and
bfloat16 (``normcert_domain``): Triton passes eps as an fp32 scalar, too coarse for float64.

``rms_norm_tuned`` is correct under every config.  ``rms_norm_tuned_drops_tail`` is the
same kernel except that its small-block config stores whole blocks only (a "vectorised"
store path taken when ``BLOCK < 64``): under ``BLOCK=1024`` it is right on every row, under
``BLOCK=32`` the last ``n % 32`` outputs of each row are never written.  A GPU whose timing
picks 1024 would certify it; normcert runs both configs and must reject it naming ``BLOCK=32``.
``rms_norm_tuned_pruned_drops_tail`` is that kernel with a pruner as shipped kernels have one
(no block wider than the row's next power of two): for rows shorter than 1024 ``BLOCK=1024`` is
pruned away and ``BLOCK=32`` runs in its place, so a failure under ``BLOCK=1024`` must say so.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .expect import correct

CONFIGS = [triton.Config({"BLOCK": 1024}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=8),
           triton.Config({"BLOCK": 32}, num_warps=1)]
DOMAIN = "dtypes=float32,float16,bfloat16"


@triton.jit
def _rows(X, W, Y, n, eps, BLOCK: tl.constexpr, WHOLE_BLOCKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * n + cols, mask=cols < n, other=0.0).to(acc.dtype)
        acc += x * x
    rstd = 1 / tl.sqrt(tl.sum(acc, 0) / n + eps)
    end = n - n % BLOCK if WHOLE_BLOCKS else n
    for start in range(0, end, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n
        x = tl.load(X + row * n + cols, mask=inside, other=0.0).to(acc.dtype)
        w = tl.load(W + cols, mask=inside, other=0.0).to(acc.dtype)
        tl.store(Y + row * n + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=inside)


@triton.autotune(CONFIGS, key=["n"])
@triton.jit
def _tuned(X, W, Y, n, eps, BLOCK: tl.constexpr):
    _rows(X, W, Y, n, eps, BLOCK, False)


@triton.autotune(CONFIGS, key=["n"])
@triton.jit
def _tuned_drops_tail(X, W, Y, n, eps, BLOCK: tl.constexpr):
    _rows(X, W, Y, n, eps, BLOCK, BLOCK < 64)


def _no_block_past_the_row(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] <= max(32, triton.next_power_of_2(named_args["n"]))]


@triton.autotune(CONFIGS, key=["n"], prune_configs_by={"early_config_prune": _no_block_past_the_row})
@triton.jit
def _tuned_pruned_drops_tail(X, W, Y, n, eps, BLOCK: tl.constexpr):
    _rows(X, W, Y, n, eps, BLOCK, BLOCK < 64)


def _launch(kernel, x, weight, eps):
    n = x.shape[-1]
    rows = x.reshape(-1, n).contiguous()
    out = torch.empty_like(rows)
    if out.numel():
        kernel[(rows.shape[0],)](rows, weight.contiguous(), out, n, eps)
    return out.reshape(x.shape)


@correct("rms_norm")
def rms_norm_tuned(x, weight, eps):
    return _launch(_tuned, x, weight, eps)


def rms_norm_tuned_drops_tail(x, weight, eps):
    return _launch(_tuned_drops_tail, x, weight, eps)


def rms_norm_tuned_pruned_drops_tail(x, weight, eps):
    return _launch(_tuned_pruned_drops_tail, x, weight, eps)


for _kernel in (rms_norm_tuned, rms_norm_tuned_drops_tail, rms_norm_tuned_pruned_drops_tail):
    _kernel.normcert_domain = DOMAIN
