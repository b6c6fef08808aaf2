"""Calling a kernel in a drawn context (``search.context``): the one place a ``Context`` is applied.

``called`` makes the inputs the context asks for (leaves that require grad, buffers rewritten
between two calls), enters the grad mode, autocast and torch's thread count in the kernel's thread
and the default dtype in the calling thread, picks the thread, and calls through ``sandbox.invoke`` (so every call keeps the
contract checks and the watchdog).  ``laid_out`` gives a cotangent the context's layout.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import replace

import torch

from ...impls import importer
from ...oracle import OPS
from ...oracle.kinds import KINDS
from ..search.context import Context
from .measure import PropertyFailure
from .sandbox import ContractViolation, KernelHung, invoke

_GRAD_OFF = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
"""The grad-off modes, entered in the kernel's thread around the call.  Grad mode "on" is entered in
the calling thread instead (``kernel_code`` calls with the caller's grad mode): a context manager
around the call would undo a kernel's own ``torch.set_grad_enabled(False)``, which must show as a
leak (``sandbox.thread_state``)."""


def trains(impl) -> bool:
    """Is the kernel one a training step calls (its op has gradients, and it is not registered
    without a backward)?  Read from the records, not by calling the kernel."""
    return bool(OPS[impl.op].grads) and impl.backward is not False


def effective(impl, case) -> Context:
    """``case.context`` as it applies to ``impl``: a kernel no training step calls gets no input
    that requires grad, no cotangent and no autocast (served's rule, ``modes``: autocast meets
    float32 cases of a training step alone); a masked op's cotangent is not expanded (its padded
    rows' cotangent is zero, a row broadcast over them would not be); torch's thread count is a
    CPU setting; the importer's thread is the calling one or is not called in (a worker's)."""
    context = case.context
    if not trains(impl):
        context = replace(context, requires="none", dy="contiguous", autocast="off")
    if context.autocast == "on" and case.dtype != torch.float32:
        context = replace(context, autocast="off")
    if context.dy == "expanded" and (case.record.mask or case.record.counts):
        context = replace(context, dy="contiguous")
    if context.threads != "run" and case.main.device.type != "cpu":
        context = replace(context, threads="run")
    if context.thread == "importer" and threading.get_ident() != importer(impl):
        context = replace(context, thread="worker")
    return context


AUTOCAST_DTYPE = torch.bfloat16
"""The dtype normcert enters autocast with (CPU autocast's, and the GPU's here): an autocast=casts
kernel's outputs may come back in it (``casting``)."""


def casting(impl, autocast: bool) -> torch.dtype | None:
    """The dtype the outputs of ``impl`` may come back in, called inside autocast or not: AUTOCAST_DTYPE
    where autocast is entered and its domain declares autocast=casts, else None (the contract's)."""
    return AUTOCAST_DTYPE if autocast and impl.domain.autocast == "casts" else None


def held_to(case, outs):
    """The case ``outs`` are held to: ``case``, or, where they came back in another floating dtype
    than the case's (an autocast=casts kernel inside autocast: ``sandbox.shaped_outputs`` admitted
    it), the case with each floating input cast to that dtype (apex's ``fused_rms_norm_affine``
    convention: its oracle, bound and VJP are those of the cast inputs)."""
    info = case.record
    args = case.oracle_args()
    cast = {o.dtype for name, o in zip(info.outputs, outs) if info.out_dtype(name, args) == case.dtype != o.dtype}
    if not cast:
        return case
    (dtype,) = cast  # one: ``sandbox.shaped_outputs`` admits the cast dtype alone, for all of them or none
    return case.replace(**{k: t.detach().to(dtype) for k, t in case.tensors.items()
                           if t is not None and t.is_floating_point()})


def leaf_names(case, context: Context) -> tuple[str, ...]:
    """The inputs that require grad in ``context``: none, every gradient input, or the one named
    (none where the case does not hold it)."""
    grads = case.record.grads_in(case.tensors)
    return {"none": (), "all": grads}.get(context.requires, tuple(k for k in grads if k == context.requires))


def own(t: torch.Tensor) -> torch.Tensor:
    """A new leaf with ``t``'s values, dtype, shape, strides and storage offset in a copy of its
    storage: the same layout (a transposed or sliced input stays so), the caller's tensor untouched."""
    storage = t.detach().untyped_storage().clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())


def _rewritten(case, state: str) -> tuple[str, ...]:
    """The floating inputs a call before the checked one sees negated (``Context.state``): x, or the
    parameters (the per-feature vectors: weight, bias; a sublayer's matrix)."""
    if state == "x rewritten":
        return (case.record.main,)
    if state == "params rewritten":
        return tuple(a.name for a in case.record.args
                     if KINDS[a.kind].shape in ("vector", "matrix") and case.tensors.get(a.name) is not None
                     and case.tensors[a.name].is_floating_point())
    return ()


def _negate(tensors) -> None:
    with torch.no_grad():
        for t in tensors:
            t.neg_()


def called(session, impl, case, within=None, mode: str = ""):
    """The kernel's outputs on ``case`` called in ``effective(impl, case)``, with the case as
    called (its inputs the leaves and buffers the context made) and the leaves by name.  An input
    given without requires_grad must come back without it (``ContractViolation``).  ``within``
    / ``mode``: a calling mode entered too (``modes``: served's autocast), as ``invoke`` takes them."""
    ctx = effective(impl, case)
    autocasting = "autocast" in mode.split(" + ")  # served's autocast mode, entered by ``within``
    leaves = leaf_names(case, ctx)
    rewritten = _rewritten(case, ctx.state)
    mine = {k: own(case.tensors[k]) for k in dict.fromkeys(leaves + rewritten)}
    for k in leaves:
        mine[k].requires_grad_(True)
    live = case.replace(**mine) if mine else case
    name = " ".join(filter(None, (mode, ctx.describe())))

    @contextlib.contextmanager
    def inside():
        with _GRAD_OFF.get(ctx.grad, contextlib.nullcontext)(), _pool(ctx.threads), \
                (torch.autocast(case.main.device.type, torch.bfloat16) if ctx.autocast == "on"
                 else contextlib.nullcontext()), \
                (within() if within is not None else contextlib.nullcontext()):
            yield

    @contextlib.contextmanager
    def around():
        before = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, ctx.dtype))
        try:
            yield
        finally:
            torch.set_default_dtype(before)

    def call():
        with torch.enable_grad() if ctx.grad == "on" else contextlib.nullcontext():
            entered = ctx.grad != "on" or within or ctx.threads != "run" or ctx.autocast == "on"
            return invoke(session, impl, live, within=inside if entered else None, mode=name,
                          around=None if ctx.dtype == "float32" else around, thread=ctx.thread,
                          cast=casting(impl, ctx.autocast == "on" or autocasting))

    if rewritten:
        _negate(mine[k] for k in rewritten)
        call()  # the call before: its outputs pass the contract's checks, their values are not held
        _negate(mine[k] for k in rewritten)  # exact: the case's own values again, in the same storage
    outs = call()
    for k, t in live.tensors.items():
        if k not in leaves and t is not None and t.requires_grad:
            raise ContractViolation(f"{impl.id} set requires_grad on its input {k!r}, which its caller gave "
                                    f"without it (a gradient not asked for: a frozen parameter made trainable)")
    return outs, live, {k: mine[k] for k in leaves}


@contextlib.contextmanager
def _pool(threads: str):
    """torch's intra-op thread count at ``threads`` ("run": as it is), in the calling thread (the
    count is read per thread), put back after."""
    before = torch.get_num_threads()
    if threads != "run":
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        if threads != "run":
            torch.set_num_threads(before)


def laid_out(c: torch.Tensor, layout: str) -> torch.Tensor:
    """Cotangent ``c`` in ``layout`` (``Context.dy``): "contiguous" as it is; "transposed" the
    transpose of a contiguous tensor holding c.mT (rank >= 2); "sliced" the first half of each row
    of a buffer twice as wide; "expanded" c's first row over every row, stride 0 (its values
    change to that: the exact VJP is taken of the tensor handed over)."""
    if layout == "transposed" and c.dim() >= 2:
        return c.mT.contiguous().mT
    if layout == "sliced" and c.dim() >= 1:
        buffer = torch.zeros(*c.shape[:-1], 2 * c.shape[-1], dtype=c.dtype, device=c.device)
        buffer[..., :c.shape[-1]] = c
        return buffer[..., :c.shape[-1]]
    if layout == "expanded" and c.dim() >= 2 and c.numel():
        return c.reshape(-1, c.shape[-1])[:1].reshape((1,) * (c.dim() - 1) + (c.shape[-1],)).expand(c.shape)
    return c


@contextlib.contextmanager
def naming(impl, case, tested: Context):
    """A failure raised inside, of a case called in a context other than ``tested`` (the family's
    as-tested one), names that context first ("in context requires=weight: ...")."""
    ctx = effective(impl, case)
    try:
        yield
    except (PropertyFailure, ContractViolation) as e:
        if ctx == tested or isinstance(e, KernelHung) or not e.args:
            raise
        e.args = (f"in context {ctx.describe(tested)}: {e.args[0]}",) + e.args[1:]
        raise
