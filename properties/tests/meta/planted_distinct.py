"""Kernels with more than one planted bug, of different kinds, in one (kernel, property, dtype) cell.

A search that stops at its first failure and shrinks it towards the simplest case reports the
simplest bug alone: an assertion on an empty batch hides a wrong value on every other batch.
``test_distinct.py`` asserts that the certificate lists each bug with its own shrunk case and
replay file, and that a kernel with one bug lists exactly one.
"""
from __future__ import annotations

import math

from ....impls.eager import up


def _rms(x, weight, eps):
    xf = up(x)
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * up(weight)).to(x.dtype)


def _halves_last_column(x, weight, eps):
    y = _rms(x, weight, eps)
    if y.shape[-1]:
        y[..., -1] *= 0.5  # scaled down, never past the range: the same kind of failure on every case
    return y


def rms_halves_last_column(x, weight, eps):
    """One bug: the last column of every row comes back halved."""
    return _halves_last_column(x, weight, eps)


def rms_two_bugs(x, weight, eps):
    """Two bugs of different kinds: an assertion on an empty batch (a crash), and the last column
    of every nonempty row halved (a wrong value)."""
    assert math.prod(x.shape[:-1]) > 0, "x.stride(0) of an empty batch"
    return _halves_last_column(x, weight, eps)
