"""Calling modes: the ways a serving engine calls a kernel, one record each.

Every property family calls a kernel the one way a test does: grad mode on, no autocast, fresh
buffers, torch's thread count as the run left it (``AS_TESTED``).  A server calls the same kernel
otherwise, and each path may hold its own bug (a ``torch.is_grad_enabled()`` fast path, statistics
rounded under autocast, a result cached by the input's address, a multi-threaded CPU loop).  The
``served`` family (``families.served``) calls the kernel on each of its cases under every mode that
applies (a grad-off mode and a thread mode in one call: ``calls``), and holds each call to the
oracle under the same bound as accuracy does:

    no_grad         inside ``torch.no_grad()``
    inference_mode  inside ``torch.inference_mode()`` (how ``vllm``/``sglang`` run a model)
    autocast        inside ``torch.autocast(device, bfloat16)``, float32 cases of an op with a
                    backward (a training step): the output's dtype still decides its bound, so a
                    float32 result must be float32-accurate; the gradients of that forward (its
                    backward run outside autocast, as torch's AMP recipe does) are held to the
                    gradients family's bound, for a kernel whose outputs carry a grad_fn
    threads=1       torch's intra-op pool at 1 thread (CPU)
    threads=N       ... at N = max(2, cores) threads (CPU): a CPU loop split across threads
    reused buffer   called again on the same input storage after new values (-x, exact) are
                    written into it in place, as a serving loop reuses its buffers: a stale or
                    mixed result is an accuracy failure
    cuda graph      captured in a ``torch.cuda.CUDAGraph`` on the case's tensors as static buffers,
                    then replayed after -x is written into x, as vLLM and SGLang serve decode steps
                    (``families.graphed``): the replayed outputs are held to the oracle of -x; a
                    capture that fails gates only where the domain declares ``capturable=yes``
                    (else the result's modes say "not capturable"); "needs a GPU" elsewhere

A mode that does not apply says why (``Mode.skip``), and the result's ``modes`` lists the modes
that ran and why each other did not.  Every mode that runs gates: its failure fails the ``served``
result, naming the mode.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

import torch

AS_TESTED = "grad on"
"""The mode of every family but ``served``: grad mode on, no autocast, fresh buffers."""


def threads_n() -> int:
    """The multi-threaded mode's pool size: every core, and at least 2 (a 1-core machine still splits)."""
    return max(2, os.cpu_count() or 1)


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _autocast(device: str):
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


@dataclass(frozen=True)
class Mode:
    """name: as the certificate writes it; enter(device): the context the kernel is called in (entered
    in the kernel's own thread, around the call alone); skip(device, dtype, trains): why the mode does
    not run here ("" where it runs), ``trains``: the kernel's outputs carry a grad_fn; reuses: the mode
    is the second call on the same storage with new values (``families.served``), not a context;
    backward: the gradients of the call are checked too (``families.gradients``); graphs: the call is
    captured in a CUDA graph and replayed (``families.graphed``), not a context."""

    name: str
    enter: Callable[[str], contextlib.AbstractContextManager] | None
    skip: Callable[[str, torch.dtype, bool], str]
    reuses: bool = False
    backward: bool = False
    graphs: bool = False


def _always(device, dtype, trains) -> str:
    return ""


def _cpu_only(device, dtype, trains) -> str:
    return "" if device == "cpu" else "torch's CPU thread pool: not on this device"


def _float32_training(device, dtype, trains) -> str:
    if dtype != torch.float32:
        return "float32 cases only (autocast lowers float32 work)"
    return "" if trains else "ops with a backward only (a training step meets autocast)"


def _gpu_only(device, dtype, trains) -> str:
    return "" if device == "cuda" else "needs a GPU"


MODES: tuple[Mode, ...] = (
    Mode("no_grad", lambda device: torch.no_grad(), _always),
    Mode("inference_mode", lambda device: torch.inference_mode(), _always),
    Mode("autocast", _autocast, _float32_training, backward=True),
    Mode("threads=1", lambda device: _threads(1), _cpu_only),
    Mode(f"threads={threads_n()}", lambda device: _threads(threads_n()), _cpu_only),
    Mode("reused buffer", lambda device: torch.no_grad(), _always, reuses=True),
    Mode("cuda graph", None, _gpu_only, graphs=True),
)
BY_NAME = {m.name: m for m in MODES}


def threads_of(modes) -> int | None:
    """The intra-op threads a call under ``modes`` (entered together) ran with, where one of them sets
    them ("threads=N"); None where none does."""
    return next((int(m.name.split("=")[1]) for m in modes if m.name.startswith("threads=")), None)


def calls(device: str, dtype: torch.dtype, trains: bool) -> list[tuple[Mode, ...]]:
    """The calls the served family makes on each case: the applicable modes, a grad-off mode and a
    thread mode entered together in one call (no_grad with 1 thread, inference mode with N), the
    others alone.  Each mode still meets every case; a bug of either mode of a pair shows in their
    call, which the failure names by both ("no_grad + threads=1")."""
    run, _ = applicable(device, dtype, trains)
    grad_off = [m for m in run if m.name in ("no_grad", "inference_mode")]
    threads = [m for m in run if m.name.startswith("threads=")]
    rest = [m for m in run if m not in grad_off and m not in threads]
    paired = [tuple(p) for p in zip(grad_off, threads)]
    single = grad_off[len(paired):] + threads[len(paired):]
    return paired + [(m,) for m in single + rest]


def applicable(device: str, dtype: torch.dtype, trains: bool) -> tuple[list[Mode], dict[str, str]]:
    """The modes that run for a kernel on ``device`` in ``dtype``, and why each other one does not."""
    run, skipped = [], {}
    for m in MODES:
        why = m.skip(device, dtype, trains)
        if why:
            skipped[m.name] = why
        else:
            run.append(m)
    return run, skipped
