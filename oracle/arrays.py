"""float64 data shared by numpy and torch, and the scratch buffers the reductions reuse.

The float64 backend keeps its values in numpy float64 arrays and runs the heavy
passes as torch ops on the same memory (torch's reductions are multi-threaded).
``np64`` and ``th`` convert between the two without copying where they can;
``buf`` hands out per-thread scratch tensors, so the reductions do not allocate
(and page-fault) a fresh buffer on every call.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

SCRATCH_MAX = 1 << 22  # elements per reusable scratch buffer (32 MiB); larger ones are fresh
_scratch = threading.local()


def np64(a) -> np.ndarray:
    """A float64 ndarray (no copy when it already is one)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def th(a: np.ndarray) -> torch.Tensor:
    """A torch view of a float64 ndarray (a copy only when torch cannot view it)."""
    if not a.flags.writeable or any(s < 0 for s in a.strides) or not a.dtype.isnative:
        a = np.array(a, dtype=np.float64)
    return torch.from_numpy(a)


def buf(slot: int, like: torch.Tensor) -> torch.Tensor:
    """A float64 scratch tensor shaped like ``like``, reused across calls (contents undefined).

    Fresh 2-D+ float64 buffers cost a page fault per 4 KiB every time, as much
    as a pass over the data; the reductions reuse a few per thread instead.
    Nothing returned to a caller ever aliases one.
    """
    n = like.numel()
    if n > SCRATCH_MAX:
        return torch.empty(like.shape, dtype=torch.float64)
    cache = getattr(_scratch, "bufs", None)
    if cache is None:
        cache = _scratch.bufs = {}
    t = cache.get(slot)
    if t is None or t.numel() < n:
        t = cache[slot] = torch.empty(n, dtype=torch.float64)
    t = t[:n]
    if like.dim() == 2 and not like.is_contiguous() and like.t().is_contiguous():
        return t.view(like.shape[1], like.shape[0]).t()  # same layout as a transposed input
    return t.view(like.shape)
