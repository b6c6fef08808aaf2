"""Calling a kernel in a drawn context (``search.context``): the one place a ``Context`` is applied.

``called`` makes the inputs the context asks for (leaves that require grad, parameters held as
``nn.Parameter``, parameters written between two calls as loaders and optimizers write them),
enters the grad mode, autocast and torch's thread count in the kernel's thread and the default
dtype and deterministic algorithms in the calling thread, picks the thread, and calls through
``sandbox.invoke`` (so every call keeps the contract checks and the watchdog).  ``backward`` runs
the backward of such a call in the same process-wide settings.  ``laid_out`` gives a cotangent the
context's layout.
"""
from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import replace

import torch

from ...impls import importer
from ...oracle import OPS
from ...oracle.kinds import KINDS
from ..search.context import Context
from .measure import PropertyFailure
from .sandbox import ContractViolation, KernelHung, invoke, kernel_code

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
    that requires grad, no cotangent, no autocast (served's rule, ``modes``: autocast meets
    float32 cases of a training step alone) and no trainable parameter (an ``nn.Parameter`` is held
    frozen, as a served model holds it); a masked op's cotangent is not expanded (its padded
    rows' cotangent is zero, a row broadcast over them would not be); a case without parameters (a
    weightless call) holds and writes none; torch's thread count is a CPU setting; the importer's
    thread is the calling one or is not called in (a worker's)."""
    context = case.context
    if not trains(impl):
        context = replace(context, requires="none", dy="contiguous", autocast="off",
                          held="Parameter" if context.held == "trainable Parameter" else context.held)
    if context.autocast == "on" and case.dtype != torch.float32:
        context = replace(context, autocast="off")
    if not parameters(case):
        context = replace(context, held="tensor", state="fresh" if context.state.startswith("params ") else context.state)
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
    (none where the case does not hold it); and every parameter with a gradient where they are
    held as trainable ``nn.Parameter`` objects."""
    grads = case.record.grads_in(case.tensors)
    asked = {"none": (), "all": grads}.get(context.requires, tuple(k for k in grads if k == context.requires))
    trained = tuple(k for k in parameters(case) if k in grads) if context.held == "trainable Parameter" else ()
    return tuple(k for k in grads if k in asked or k in trained)


def parameters(case) -> tuple[str, ...]:
    """The case's parameters: its floating per-feature vectors (weight, bias) and matrices (a
    sublayer's), the inputs a model holds and a loader or an optimizer writes."""
    return tuple(a.name for a in case.record.args
                 if KINDS[a.kind].shape in ("vector", "matrix") and case.tensors.get(a.name) is not None
                 and case.tensors[a.name].is_floating_point())


def _rewritten(case, state: str) -> tuple[str, ...]:
    """The floating inputs a call before the checked one sees negated (``Context.state``): x, or the
    parameters (``parameters``)."""
    if state == "x rewritten":
        return (case.record.main,)
    if state.startswith("params "):
        return parameters(case)
    return ()


def _built(t: torch.Tensor, storage, held: bool, requires: bool) -> torch.Tensor:
    """A new tensor object over ``storage`` with ``t``'s dtype, shape, strides and offset: an
    ``nn.Parameter`` where ``held``, requiring grad where ``requires``.  Every one is built the same
    way, so each starts at the same ``_version``."""
    return _holding(_over(t, storage), held, requires)


def _over(t: torch.Tensor, storage) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())


def _holding(flat: torch.Tensor, held: bool, requires: bool) -> torch.Tensor:
    """A new object over ``flat`` (sharing its version counter): an ``nn.Parameter`` where ``held``."""
    return torch.nn.Parameter(flat, requires_grad=requires) if held else flat.detach().requires_grad_(requires)


def _storage(t: torch.Tensor, negated: bool):
    """A copy of ``t``'s storage, every element negated where ``negated`` (exact: negating again
    gives the bits back)."""
    storage = t.detach().untyped_storage().clone()
    if negated:
        torch.empty(0, dtype=t.dtype, device=t.device).set_(storage).neg_()
    return storage


def _write_back(case, mine: dict, names: tuple[str, ...], state: str) -> None:
    """Write the case's values into the inputs ``names`` of ``mine`` (holding them negated), by the
    write path of ``state`` (``Context.state``; "params replaced" is ``_replace``'s)."""
    new = {k: case.tensors[k] for k in names}
    if state == "params load_state_dict":
        module = torch.nn.Module()
        for k in names:
            if isinstance(mine[k], torch.nn.Parameter):
                module.register_parameter(k, mine[k])
            else:
                module.register_buffer(k, mine[k])
        module.load_state_dict(new)
        return
    for k in names:
        if state == "params .data.copy_":
            mine[k].data.copy_(new[k])
        elif state == "params copy_ under no_grad":
            with torch.no_grad():
                mine[k].copy_(new[k])
        else:  # "x rewritten", "params rewritten": exact, the case's own values again
            with torch.no_grad():
                mine[k].neg_()


REBUILDS = 8
"""How many new objects ``_replace`` builds at most for a weight before it takes one whose id is not
the dead weight's (a kernel that keeps the old weight alive: its id cannot recur)."""


def _replace(case, mine: dict, names: tuple[str, ...], held: tuple[str, ...], leaves: tuple[str, ...]) -> None:
    """Replace each weight of ``names`` in ``mine`` by a new object holding the case's values, built
    as the old one was over its memory after the old one is freed: the new one takes the dead one's
    id (CPython hands a freed object's memory to the next object of its size: built until it does,
    ``REBUILDS`` at most), address and ``_version``."""
    for k in names:
        storage, gone = mine[k].untyped_storage(), id(mine[k])
        storage.copy_(case.tensors[k].detach().untyped_storage())
        flat = _over(case.tensors[k], storage)  # made first: the next object made is the new weight
        old = weakref.ref(mine[k])
        del mine[k]  # the caller holds no other reference: the old weight is freed here, or once a
        _freed(old)  # thread that held it for a moment (the pulse's look at the frames) lets it go
        misses = []
        for attempt in range(REBUILDS):
            new = _holding(flat, k in held, k in leaves)
            if id(new) == gone:
                break
            misses.append(new)
            time.sleep(0)
        mine[k] = new
        del misses, flat


FREEING = 0.1
"""Seconds ``_freed`` waits for a dead weight's last transient reference to go."""


def _freed(ref: weakref.ref) -> None:
    """Wait, ``FREEING`` seconds at most, for the object of ``ref`` to be freed: a kernel that keeps
    it (a cache holding the weight itself) keeps it for ever, and its id cannot recur."""
    end = time.monotonic() + FREEING
    while ref() is not None and time.monotonic() < end:
        time.sleep(0.001)


def called(session, impl, case, within=None, mode: str = ""):
    """The kernel's outputs on ``case`` called in ``effective(impl, case)``, with the case as
    called (its inputs the leaves, parameters and buffers the context made) and the leaves by name.
    An input given without requires_grad must come back without it (``ContractViolation``).
    ``within`` / ``mode``: a calling mode entered too (``modes``: served's autocast), as ``invoke``
    takes them."""
    ctx = effective(impl, case)
    autocasting = "autocast" in mode.split(" + ")  # served's autocast mode, entered by ``within``
    leaves = leaf_names(case, ctx)
    rewritten = _rewritten(case, ctx.state)
    held = parameters(case) if ctx.held != "tensor" else ()
    mine = {k: _built(case.tensors[k], _storage(case.tensors[k], k in rewritten), k in held, k in leaves)
            for k in dict.fromkeys(leaves + rewritten + held)}
    live = case.replace(**mine) if mine else case
    name = " ".join(filter(None, (mode, ctx.describe())))

    @contextlib.contextmanager
    def inside():
        with _GRAD_OFF.get(ctx.grad, contextlib.nullcontext)(), _pool(ctx.threads), \
                (torch.autocast(case.main.device.type, torch.bfloat16) if ctx.autocast == "on"
                 else contextlib.nullcontext()), \
                (within() if within is not None else contextlib.nullcontext()):
            yield

    def call():
        with torch.enable_grad() if ctx.grad == "on" else contextlib.nullcontext():
            entered = ctx.grad != "on" or within or ctx.threads != "run" or ctx.autocast == "on"
            return invoke(session, impl, live, within=inside if entered else None, mode=name,
                          around=_process_wide(ctx), thread=ctx.thread,
                          cast=casting(impl, ctx.autocast == "on" or autocasting))

    if rewritten:
        call()  # the call before, on the negated values: its outputs pass the contract's checks, their values are not held
        if ctx.state == "params replaced":
            live = None  # the old weights' last references are ``mine``'s
            _replace(case, mine, rewritten, held, leaves)
        else:
            _write_back(case, mine, rewritten, ctx.state)
        live = case.replace(**mine)
    outs = call()
    for k, t in live.tensors.items():
        if k not in leaves and t is not None and t.requires_grad:
            raise ContractViolation(f"{impl.id} set requires_grad on its input {k!r}, which its caller gave "
                                    f"without it (a gradient not asked for: a frozen parameter made trainable)")
    return outs, live, {k: mine[k] for k in leaves}


def backward(session, impl, case, thunk):
    """``thunk()``, the backward of outputs ``called`` returned for ``case``, as the kernel's code
    (``sandbox.kernel_code``) in the process-wide settings of the case's context: the default
    dtype, deterministic algorithms and torch's thread count hold for a backward as for its
    forward (autocast does not: torch's AMP recipe runs the backward outside it)."""
    ctx = effective(impl, case)

    def pooled():
        with _pool(ctx.threads):
            return thunk()

    around = _process_wide(ctx)
    with around() if around is not None else contextlib.nullcontext():
        return kernel_code(session, impl, " backward", pooled, case.dtype)


def _process_wide(ctx: Context):
    """The context factory of ``ctx``'s process-wide settings (the default dtype, deterministic
    algorithms), entered in the calling thread around a call and put back after; None where both are
    as tested (the call enters nothing)."""
    if ctx.dtype == "float32" and ctx.deterministic == "off":
        return None

    @contextlib.contextmanager
    def around():
        dtype = torch.get_default_dtype()
        on, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        torch.set_default_dtype(getattr(torch, ctx.dtype))
        if ctx.deterministic == "on":
            torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.set_default_dtype(dtype)
            torch.use_deterministic_algorithms(on, warn_only=warn_only)
    return around


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
