"""Kernels right for their first 2048 calls and wrong after (``families.long_run``), and their twin.

Each is a callable object, an rms_norm(x, weight, eps) with a per-object workspace ring of ``SLOTS``
slots, one per call in turn (call c uses slot (c - 1) mod SLOTS), each holding the sum of squares
of the rows it was last used for.  The object is its own state: a meta-test makes a fresh one per
seed, and nothing is shared between modules.
"""
from __future__ import annotations

import torch

SLOTS = 2048


class RingRms:
    """rms_norm with a ring of SLOTS workspaces; ``zeroes``: a slot is cleared before its reuse.

    Without it (the bug) a slot accumulates: call c computes s_c = sum_j x_j^2 + s_{c - SLOTS}
    (s = 0 for c <= SLOTS), so calls 1 .. SLOTS are right and every call from SLOTS + 1 on
    divides by sqrt((k + 1) mean x^2 + eps) on its k-th time round the ring."""

    def __init__(self, zeroes: bool):
        self.zeroes = zeroes
        self.calls = 0
        self.ring: list[torch.Tensor | None] = [None] * SLOTS
        self.__name__ = "rms_ring_zeroed" if zeroes else "rms_ring_accumulates"

    def __call__(self, x, weight, eps):
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        slot = self.calls % SLOTS
        self.calls += 1
        xf = x.to(compute)
        squares = xf.pow(2).sum(-1, keepdim=True)
        held = self.ring[slot]
        if held is None or held.shape != squares.shape or held.dtype != compute or held.device != x.device:
            held = torch.zeros_like(squares)
        elif self.zeroes:
            held = held.zero_()
        held = held + squares
        self.ring[slot] = held.detach()
        y = xf * torch.rsqrt(held / x.shape[-1] + eps)
        return (y if weight is None else y * weight.to(compute)).to(x.dtype)
