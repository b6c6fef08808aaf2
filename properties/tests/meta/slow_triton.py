"""A slow interpreted Triton kernel, for the watchdog's meta-test (``test_hostile``): a row copy, one
program per row, each program pausing ``PAUSE`` seconds, as a long row's Python loop under Triton's
interpreter does.  A call's time grows with its rows while every program finishes: slow, not hung.
(Under the interpreter a kernel's body is Python, so it may call ``time.sleep``; a GPU could not.)"""
from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

PAUSE = 0.05  # seconds per program


def _pause():
    time.sleep(PAUSE)


@triton.jit
def _copy_rows(X, Y, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    _pause()
    tl.store(Y + row * n + cols, tl.load(X + row * n + cols, mask=cols < n), mask=cols < n)


def copy_rows(x):
    """``x`` (rows, n), copied one program per row."""
    y = torch.empty_like(x)
    _copy_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
