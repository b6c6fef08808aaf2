"""The halves form of an op: one main tensor whose last dim is [first | second], the two row
inputs of a base op (``record.Op.halves``), as silu_and_mul(x) = swiglu(x[..., :h], x[..., h:]):

    op(x, rest)   = base(x[..., :h], x[..., h:], rest),  h = x.shape[-1] / 2
    d op / dx     = concat(d base / d first, d base / d second)   along the last dim

``split`` and ``join`` say that once; ``oracle`` derives the op's oracle (forward or VJP) from the
base op's, and ``bounds_derived.halves`` its error-model bounds from the base op's bounds.
"""
from __future__ import annotations

import numpy as np


def split(values: dict, main: str, parts: tuple[str, str]) -> dict:
    """``values`` by argument name with ``main`` replaced by its two halves, named ``parts``."""
    x = values[main]
    h = x.shape[-1] // 2
    out = {k: v for k, v in values.items() if k != main}
    out[parts[0]], out[parts[1]] = x[..., :h], x[..., h:]
    return out


def join(grads: dict, main: str, parts: tuple[str, str]) -> dict:
    """The gradients of the two halves, ``parts``, as the gradient of ``main``."""
    return {main: np.concatenate([grads[parts[0]], grads[parts[1]]], axis=-1)}


def oracle(base, main: str, parts: tuple[str, str]):
    """The halves form of an oracle function: ``base(B, **args)`` (forward, tuple of outputs) or
    ``base(B, cotangents, **args)`` (VJP, gradients by input name, joined)."""

    def on_halves(B, *cotangents, **args):
        out = base(B, *cotangents, **split(args, main, parts))
        return join(out, main, parts) if cotangents else out

    return on_halves
