"""The ``cuda graph`` calling mode: the kernel captured once on static buffers and replayed.

vLLM and SGLang serve decode steps from CUDA graphs: the model is called once on static input
buffers while a ``torch.cuda.CUDAGraph`` records the device work, and each step then copies its
values into those buffers and replays the recording, which rewrites the same output buffers.  What
a graph replays is only the device work of the captured call: host code does not run again, so a
value the kernel computed on the host (read back with ``.item()``, cached in Python by the input's
address, or baked in as a launch argument) stays what it was at capture.

For a case with main input x, ``graphed`` does, on the case's own tensors as the static buffers:

    1. warm-up  the kernel called once on a side stream (lazy initialisation, autotuning and
                compilation happen outside the capture, as ``torch.cuda.graphs`` recommends);
                a failure here is the kernel's, as in any mode
    2. capture  the call recorded in a graph, under ``torch.no_grad()`` (a served forward);
                its outputs are the graph's static outputs
    3. replay   -x written into x in place (exact in every format, as the reused-buffer mode
                does), the graph replayed, and the static outputs held to the oracle of the case
                with -x under accuracy's bound; x is put back whatever happens

A capture that raises (a host sync such as ``.item()``, a CPU tensor, a stream the capture does
not know) is not an accuracy failure: the kernel is *not capturable*.  That fails the served result
only where the kernel's domain declares ``capturable=yes``; otherwise it is noted on the result's
modes ("cuda graph: not capturable: ...", ``session.uncapturable``) and nothing is checked.  A
domain declaring ``capturable=no`` is not captured at all.

``graph`` is the recording: ``CudaGraph`` on a GPU; the meta-tests give a stand-in that replays by
calling again, so the steps around it are tested on CPU too.
"""
from __future__ import annotations

import torch

from ..harness.measure import PropertyFailure, check_against_oracle
from ..harness.sandbox import ContractViolation, KernelHung, kernel_code, shaped_outputs


class CudaGraph:
    """One ``torch.cuda.CUDAGraph``: ``capture(fn)`` warms fn up on a side stream, records one call
    and returns its (static) outputs; ``replay()`` runs the recorded work again and waits for it."""

    def __init__(self):
        self.graph = torch.cuda.CUDAGraph()

    @staticmethod
    def warm(fn) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def capture(self, fn):
        with torch.cuda.graph(self.graph):
            return fn()

    def replay(self) -> None:
        self.graph.replay()
        torch.cuda.synchronize()


def graphed(session, impl, case, worst, where, graph=CudaGraph) -> None:
    """Steps 1-3 of the module docstring on ``case``; ``PropertyFailure`` for a replay that differs
    from the oracle, or for a capture that fails where ``capturable=yes`` is declared."""
    if impl.domain.capturable is False:
        return
    args = case.oracle_args()
    g = graph()

    def call():
        with torch.no_grad():
            return case.record.call(impl.fn, args)

    key = (case.dtype, False, "cuda graph")
    kernel_code(session, impl, " (warm-up before a CUDA-graph capture)", lambda: g.warm(call), key)
    try:
        out = kernel_code(session, impl, " under CUDA-graph capture", lambda: g.capture(call), key)
    except KernelHung:
        raise
    except ContractViolation as e:
        if impl.domain.capturable:
            raise PropertyFailure(f"not capturable, though its domain declares capturable=yes: {e}") from None
        session.uncapturable.setdefault(impl.id, str(e))
        return
    outs = shaped_outputs(impl, case, args, out)
    x = case.main
    with torch.no_grad():
        x.neg_()
    try:
        kernel_code(session, impl, " (its CUDA graph replayed)", g.replay, key)
        check_against_oracle(case.record.decode(outs, args), case, worst, where=where)
    finally:
        with torch.no_grad():
            x.neg_()
