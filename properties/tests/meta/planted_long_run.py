"""Kernels a long run catches (``families.long_run``), each with its twin, one flag apart.

Each is a callable object, an rms_norm(x, weight, eps) with state of its own: ``RingRms`` a
workspace ring of ``SLOTS`` slots shared by every dtype (wrong from its call SLOTS + 1 on),
``DtypeRingRms`` one kept per dtype for its bfloat16 path (wrong from its SLOTS + 1-th bfloat16
call on), ``OutputRingRms`` a ring of persistent output buffers (a kept result overwritten),
``SampledRms`` a path taken one call in ``SAMPLE`` (that call wrong).  The object is its own
state: a meta-test makes a fresh one per seed, and nothing is shared between modules.
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


class DtypeRingRms:
    """rms_norm whose bfloat16 path accumulates the sum of squares in one of SLOTS float32 workspace
    slots kept per dtype (call c of the dtype uses slot (c - 1) mod SLOTS); ``zeroes``: a slot is
    cleared before its reuse.  Without it (the bug) the bfloat16 calls from the dtype's SLOTS + 1-th
    on divide by sqrt((k + 1) mean x^2 + eps) on their k-th time round; the other dtypes'
    calls never advance the bfloat16 ring, so a run whose long run is made in another dtype alone
    never meets it."""

    def __init__(self, zeroes: bool):
        self.zeroes = zeroes
        self.rings: dict[torch.dtype, list] = {}
        self.calls: dict[torch.dtype, int] = {}
        self.__name__ = "rms_dtype_ring_zeroed" if zeroes else "rms_dtype_ring_accumulates"

    def __call__(self, x, weight, eps):
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(compute)
        squares = xf.pow(2).sum(-1, keepdim=True)
        if x.dtype == torch.bfloat16:
            ring = self.rings.setdefault(x.dtype, [None] * SLOTS)
            slot = self.calls.get(x.dtype, 0) % SLOTS
            self.calls[x.dtype] = self.calls.get(x.dtype, 0) + 1
            held = ring[slot]
            if held is None or self.zeroes or held.shape != squares.shape or held.device != x.device:
                held = torch.zeros_like(squares)
            squares = held + squares
            ring[slot] = squares.detach()
        y = xf * torch.rsqrt(squares / x.shape[-1] + eps)
        return (y if weight is None else y * weight.to(compute)).to(x.dtype)


class OutputRingRms:
    """rms_norm that writes its output into one of ``buffers`` persistent buffers per (shape, dtype,
    device), handed out round robin, as a kernel with preallocated outputs does; ``buffers=0`` (the
    twin): a fresh output every call.  A caller that keeps results (embeddings of several batches)
    finds call c's result overwritten by call c + buffers: the long run holds every call's outputs
    alive, where the served calls hold only the last two (``sandbox.HELD_CALLS``)."""

    def __init__(self, buffers: int):
        self.buffers = buffers
        self.ring: dict[tuple, list] = {}
        self.__name__ = f"rms_output_ring_{buffers}" if buffers else "rms_output_fresh"

    def __call__(self, x, weight, eps):
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(compute)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = (y if weight is None else y * weight.to(compute)).to(x.dtype)
        out = self._buffer(y) if self.buffers else torch.empty_like(y)
        return out.copy_(y)

    def _buffer(self, y):
        held = self.ring.setdefault((tuple(y.shape), y.dtype, y.device, torch.is_inference_mode_enabled()), [])
        if len(held) < self.buffers:
            held.append(torch.empty_like(y))
        else:
            held.append(held.pop(0))  # round robin: the buffer handed out longest ago
        return held[-1]


SAMPLE = 5000  # the sampling kernel's period


class SampledRms:
    """rms_norm with a telemetry path taken one call in SAMPLE (the object's calls c with c mod SAMPLE
    = SAMPLE - 1, counted over every dtype): it records the rows' inverse rms, and ``early`` (the
    bug) reads the record before it is written, a zero, so that call's output is zero.  ``wrong``:
    the calls (1-based, the object's count) it made so."""

    def __init__(self, early: bool):
        self.early = early
        self.calls = 0
        self.wrong: list[int] = []
        self.__name__ = "rms_sampled_early" if early else "rms_sampled"

    def __call__(self, x, weight, eps):
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        self.calls += 1
        xf = x.to(compute)
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if self.calls % SAMPLE == SAMPLE - 1:  # the telemetry sample: the statistic recorded
            record = torch.zeros_like(inv)
            if self.early:  # the bug: the record read before it is written
                self.wrong.append(self.calls)
                inv = record
            record.copy_(inv.detach())
        y = xf * inv
        return (y if weight is None else y * weight.to(compute)).to(x.dtype)
