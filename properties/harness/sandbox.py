"""The kernel sandbox: calling an untrusted kernel, and everything it may do wrong.

A kernel is untrusted.  ``invoke`` turns everything it can do wrong -- raise
anything (``SystemExit`` included; only ``KeyboardInterrupt`` passes), return
None or a tuple where a tensor is due, the wrong shape, dtype or device,
mutate an input -- into a ``ContractViolation`` that names the kernel and what
it did.  ``kernel_code`` does the same for the kernel's backward: it runs the
call in the session's worker thread (``Worker``) under a watchdog, and saves and
restores torch's thread and global state around it.  Everything here takes the
run's ``Session`` (settings, hung kernels, the worker, the outputs held) as its
first argument; the module holds no run state.
"""
from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
import weakref
from dataclasses import dataclass

import torch

from ...impls import flushes_denormals, importer
from . import interpreter, launches
from ..search.case import Case
from .run_settings import FIRST_CALL, PROGRESSING

class ContractViolation(AssertionError):
    """The kernel broke the calling contract (not a numerical failure).  ``kind``: which failure this
    is where the raiser knows (a kernel's exception: its type and the place it was raised), for
    telling distinct failures of one cell apart (``runner.kind_of``)."""

    def __init__(self, message: str = "", kind: str = ""):
        super().__init__(message)
        self.kind = kind



class NotSupported(Exception):
    """The kernel raised NotImplementedError for this input; ``why``: its message."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the storage ``t`` views, not just the elements in its view."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).clone()


def snapshot(case: Case) -> dict:
    return {k: _storage_bytes(t) for k, t in case.tensors.items() if t is not None}


def check_unmutated(impl, case: Case, before: dict, chunk: int = 1 << 28, backward: bool = False) -> None:
    """The storage behind every input still holds the bytes of ``snapshot``: compared in place, a
    chunk of bytes at a time (a copy, or one comparison of the whole storage, would take as much
    device memory again as the input: ``--profile large`` cases fill the device).  ``backward``:
    the writer was the kernel's backward (Liger's SwiGLU writes its gradients over the forward's
    gate and up): the bytes are put back before the violation is raised, so that the case the
    failure reports, saves and replays holds the values the forward was called on."""
    wrote = []
    for k, raw in before.items():
        now = torch.empty(0, dtype=torch.uint8, device=raw.device).set_(case.tensors[k].untyped_storage())
        if now.numel() != raw.numel() or not all(torch.equal(now[a:a + chunk], raw[a:a + chunk])
                                                 for a in range(0, raw.numel(), chunk)):
            if not backward:
                raise ContractViolation(f"{impl.id} mutated its input {k!r} (bits changed in its storage)")
            if now.numel() == raw.numel():
                now.copy_(raw)
            wrote.append(repr(k))
    if wrote:
        raise ContractViolation(f"{impl.id}: its backward wrote into its input {' and '.join(wrote)} (the "
                                f"forward's, which the caller still holds: bits changed in its storage)")


def check_fresh(impl, case: Case, names, outs) -> None:
    """Outputs live in storage of their own: not an input's, not each other's."""
    owners = {t.untyped_storage().data_ptr(): f"input {k!r}" for k, t in case.tensors.items()
              if t is not None and t.numel()}
    for name, o in zip(names, outs):
        if o.numel() == 0:
            continue
        ptr = o.untyped_storage().data_ptr()
        if ptr in owners:
            raise ContractViolation(f"{impl.id} returned {name} in the storage of its {owners[ptr]}")
        owners[ptr] = f"output {name!r}"


def expected_shapes(case: Case):
    return list(case.record.out_shapes(tuple(case.main.shape), case.scalars))


def check_layouts(impl, case: Case, outs) -> None:
    """An output whose memory layout an argument declares (``record.Out.layout_arg``: a per-group
    scale a GEMM reads) is laid out so: "row_major" contiguous, "column_major" contiguous groups
    first (its last dim outermost), as ``torch.empty(groups, rows).T`` is, "mn_major" each matrix of
    its last two dims so ((E, T, G) strides (T G, 1, T), as ``torch.empty(E, G, T).transpose(1, 2)``); an FP4 op's "linear" and
    "swizzled" scales contiguous (the swizzled tiles are the order of its memory, ``oracle.fp4``)."""
    for o, t in zip(case.record.outs, outs):
        if o.layout_arg is None:
            continue
        layout = case.scalars[o.layout_arg]
        ok = {"column_major": lambda: t.movedim(-1, 0).is_contiguous(),
              "mn_major": lambda: t.transpose(-1, -2).is_contiguous()}.get(layout, t.is_contiguous)()
        what = "contiguous" if layout in ("linear", "swizzled") else layout
        if not ok:
            raise ContractViolation(f"{impl.id} returned {o.name} with strides {tuple(t.stride())} for shape "
                                    f"{tuple(t.shape)}, expected {what} ({o.layout_arg}={layout!r})")


RECOMPILE_LIMIT = 4096
"""Dynamo's recompile limits in the kernel thread.  torch.compile recompiles a function for each new
guard (dtype, rank, a None weight, a stride, grad mode) and, past ``recompile_limit`` (8 in torch
2.13) compilations of one function, silently runs the rest of its calls *eagerly*.  A model sees a
handful of signatures; normcert's draws show a compiled kernel dozens (rms_norm's accuracy family
alone: 8 by its 24th call), so under the default a compiled kernel would be certified on code that
did not run.  Raised for the calls normcert makes, and a call that still reaches it fails instead
of falling back (``fail_on_recompile_limit_hit``)."""


def compile_every_call() -> bool:
    """In this thread (Dynamo's config is per thread): every call of a torch.compiled kernel runs
    compiled code, or fails saying why (``RECOMPILE_LIMIT``).  False where Dynamo is not loaded yet
    (importing it costs about 1.3 s, which a run of a kernel that does not compile never pays): a
    kernel's first compilation loads it and this call's limit is the default; it is set before the next."""
    config = getattr(sys.modules.get("torch._dynamo"), "config", None)
    if config is None:
        return False
    config.recompile_limit = config.accumulated_recompile_limit = RECOMPILE_LIMIT
    config.fail_on_recompile_limit_hit = True
    return True


@dataclass
class Waited:
    """How a call in the ``Worker`` went: ``finished``, or abandoned as hung; the ``seconds`` it was
    waited for; the ``programs`` of interpreted launches it started meanwhile
    (``properties.harness.interpreter.programs``); ``advancing``: still starting programs when it was abandoned
    (it ran past ``PROGRESSING`` times its limit)."""

    finished: bool
    seconds: float
    programs: int
    advancing: bool = False


class Worker:
    """One long-lived daemon thread that runs a session's kernel calls (``Session.worker``);
    abandoned when a call hangs in it (the next call starts a fresh one), told to end when the
    session is collected.

    A thread per call would cost ~0.5 ms a call (thread start plus torch's
    per-thread set-up).  A daemon thread, not a ThreadPoolExecutor: the
    executor's threads are joined at interpreter exit, so a hung kernel would
    keep the process alive for ever.
    """

    def __init__(self):
        self.tasks = None
        self.thread = None  # the ident of the thread calls run in (their interpreted programs are counted by it)

    def _start(self) -> None:
        tasks = queue.SimpleQueue()

        def loop():
            compiling = False  # this thread's Dynamo config is set (once Dynamo is loaded)
            while True:
                fn, done = tasks.get()
                if fn is None:
                    return  # retired
                compiling = compiling or compile_every_call()
                fn()  # never raises: kernel_code's call() keeps the exception
                del fn  # before the caller is told: it may free the call's arguments and count on them gone
                done.set()
                del done

        thread = threading.Thread(target=loop, name="normcert-kernel", daemon=True)
        thread.start()
        weakref.finalize(self, tasks.put, (None, None))  # the session is gone: its thread ends (unless hung)
        self.tasks, self.thread = tasks, thread.ident

    def run(self, fn, timeout: float, progressed=lambda: None) -> Waited:
        """Run ``fn`` in the worker and wait for it.  It is hung once ``timeout`` seconds pass with
        neither its result nor progress: a program of an interpreted Triton launch started in its
        thread (under the interpreter a launch's grid is a Python loop, and a call of a thousand
        programs on a loaded machine can take minutes while each program takes milliseconds).  So a
        call is given time in proportion to the programs it runs, up to ``PROGRESSING`` timeouts in
        all; ``progressed()`` is called each time a timeout passes with progress (the heartbeat)."""
        if self.tasks is None:
            self._start()
        done = threading.Event()
        start = time.monotonic()
        first = seen = interpreter.programs(self.thread)
        self.tasks.put((fn, done))
        while not done.wait(timeout):
            now = interpreter.programs(self.thread)
            waited = time.monotonic() - start
            if now == seen or waited >= PROGRESSING * timeout:
                self.tasks = None  # its thread is stuck in the kernel; the next call starts a new one
                return Waited(False, waited, now - first, advancing=now != seen)
            seen = now
            progressed()
        return Waited(True, time.monotonic() - start, interpreter.programs(self.thread) - first)

    def retire(self) -> None:
        """Leave the current thread behind: the next call starts a new one."""
        if self.tasks is not None:
            self.tasks.put((None, None))
            self.tasks = None


class KernelHung(ContractViolation):
    """The kernel gave no result within --kernel-timeout, nor progress; its later calls in the
    same result fail at once (``kernel_code``)."""


def _hung(impl, what: str, limit: float, waited: Waited) -> str:
    """What the watchdog says of a call it gave up on."""
    text = f"{impl.id}{what} hung: no result after {limit:g} s" if not waited.programs else \
        f"{impl.id}{what} hung: no result after {waited.seconds:.1f} s"
    if waited.advancing:
        return (f"{text}, {PROGRESSING} times its {limit:g} s limit, though its interpreted launches were still "
                f"advancing ({waited.programs} programs)")
    if waited.programs:
        return f"{text}: its interpreted launches ran {waited.programs} programs, then none for {limit:g} s"
    return text


def _slow(what: str, limit: float, waited: Waited) -> str:
    """What a result says of its slowest call that ran past its limit, advancing (``Worker.run``)."""
    return (f"slow, not hung: a call{what} took {waited.seconds:.1f} s, past its {limit:g} s limit, while its "
            f"interpreted launches kept advancing ({waited.programs} programs)")


def kernel_code(session, impl, what: str, thunk, specialisation=None, thread: str = "worker"):
    """``thunk()`` (a call into kernel code) under the watchdog; its failures are the kernel's.

    The call runs in the session's worker thread (``Worker``), with the caller's grad mode, and is given
    ``session.kernel_timeout`` seconds; the first call of ``what`` for a ``specialisation``
    (dtype, grad mode) in this process, FIRST_CALL times that: torch.compile and Triton compile
    there (on an H100 with 15 xdist workers compiling at once, a compiled add_rms_norm's first
    backward took more than 60 s).  A call whose interpreted Triton launches keep advancing gets
    more (``Worker.run``), and is noted on the session as slow, not hung (``session.slow``: its
    next result says so).  A call with neither a result nor progress in its limit is hung: the
    kernel is marked in ``session.hung``, and this call and every later one of the same result
    fail at once with "hung: no result after T s" (the thread cannot be killed; it is left behind
    and dies with the process).  Once the result is recorded (``runner.record``), the kernel's next
    result calls it again, in a fresh thread.  Any exception but KeyboardInterrupt is a ``ContractViolation``
    naming the kernel; NotImplementedError is ``NotSupported`` (a refusal).  ``thread`` (``Context.thread``):
    "worker" as above; "fresh": the call runs in a thread started for it alone (a ``Worker`` of its own,
    retired after it), under the same watchdog; "importer": the call runs in the calling thread, which
    must be the one that imported the kernel's module (``impls.importer``): no watchdog can stop a call
    in its own thread, so such a call is timed only (past its limit it is noted slow), and a hang there
    is the run's own timeout's; thread-local state it leaves changed fails it, and is put back where
    torch can (grad mode, autocast, flush-to-zero, the intra-op thread count).  A thread count left
    changed is put back in every thread, the kernel's own: a thread started later inherits it.
    torch's global state (``global_state``) is restored after the call, and a
    kernel that changed it is a ``ContractViolation`` too.  A kernel whose module changed the
    process's floating-point state at import (``Impl.import_fault``) fails every call, uncalled.
    Its Triton launches are counted (``launches.record``) for its result's row.
    """
    launches.record()
    if impl.import_fault:
        raise ContractViolation(f"{impl.id}{what}: its module {impl.import_fault}, a change to the floating-point "
                                f"state normcert's oracle computes in (turned off again; the kernel is not called)")
    box: dict = {}
    grad = torch.is_grad_enabled()

    def call():
        try:
            with torch.set_grad_enabled(grad):
                before = thread_state()
                try:
                    box["value"] = _rehomed(thunk())
                finally:
                    now = thread_state()
                    box["leaked"] = _changes(before, now)
                    if now["intra-op threads"] != before["intra-op threads"]:
                        torch.set_num_threads(before["intra-op threads"])  # what a thread started later inherits
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below, as words:
            box["error"] = type(e)  # its message is made here, under the watchdog (a __str__ may block)
            box["benchmarked"] = _benchmarked(e)
            box["place"] = raised_at(e)
            try:
                box["text"] = first_line(e)
            except BaseException:  # noqa: BLE001 - a __str__ that raises
                box["text"] = "(its message could not be formatted)"

    before, rng = global_state(), torch.get_rng_state()
    key = (impl.id, what, specialisation)
    limit = session.kernel_timeout * (1 if key in session.called else FIRST_CALL)
    if session.worker is None:
        session.worker = Worker()
    worker = Worker() if thread == "fresh" else _Inline(impl) if thread == "importer" else session.worker
    if impl.id not in session.hung:
        with session.forcing(impl).active():  # an autotuned kernel runs the config the runner selected
            waited = worker.run(call, limit, session.beat)
        if thread == "fresh" and waited.finished:
            worker.retire()
        if not waited.finished:
            session.hung[impl.id] = _hung(impl, what, limit, waited)
        elif waited.seconds > limit:
            slowest = session.slow.get(impl.id, (0.0, ""))
            session.slow[impl.id] = max(slowest, (waited.seconds, _slow(what, limit, waited)))
    session.called.add(key)
    session.beat()
    if impl.id in session.hung:
        # one raise for the call that hung and every later one of its result: Hypothesis replays a
        # failing example and calls a failure raised from another line a different ("flaky") one
        raise KernelHung(session.hung[impl.id])
    changed = restore_global_state(before)
    torch.set_rng_state(rng)  # a kernel that draws random numbers must not shift later draws
    if box.get("leaked"):
        worker.retire()  # its thread-local state is the kernel's now: the next call gets a fresh thread
    error = box.get("error")
    if error is None and changed:
        raise ContractViolation(f"{impl.id}{what} changed torch's global state: {changed} (restored)")
    if error is None and box.get("leaked"):
        raise ContractViolation(f"{impl.id}{what} left torch's thread-local state changed: {box['leaked']} "
                                f"(the next call runs in a fresh thread)")
    if error is None:
        return box["value"]
    if issubclass(error, NotImplementedError):
        raise NotSupported(f"{impl.id} refused this case: {box['text']}", box["text"])
    if issubclass(error, KeyboardInterrupt):
        raise KeyboardInterrupt
    if error.__name__ == "FailOnRecompileLimitHit":
        raise ContractViolation(f"{impl.id}{what}: torch.compile recompiled it {RECOMPILE_LIMIT} times, normcert's "
                                f"limit; past it Dynamo would run its eager code, which is not what is certified "
                                f"(declare a narrower domain, --normcert-domain)")
    unfound = UNFOUND_AUTOTUNER if box["benchmarked"] else ""
    raise ContractViolation(f"{impl.id}{what} raised {error.__name__}: {box['text']}{unfound}",
                            kind=f"{impl.id}{what} raised {error.__name__} at {box['place']}")


def raised_at(e: BaseException) -> str:
    """Where ``e`` was raised: "FILE:LINE" of the innermost frame of its traceback ("" if none)."""
    tb = e.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


UNFOUND_AUTOTUNER = (" (raised in Triton's autotuner benchmarking its configs: the kernel reached an autotuner "
                     "normcert did not find, so its configs were not forced one by one; normcert follows the "
                     "kernel's global names, the module attributes they name and closures, properties.harness.autotune.tuners)")


def _benchmarked(e: BaseException) -> bool:
    """Did ``e`` come from a Triton autotuner's own benchmarking?  A forced autotuner
    (``properties.harness.autotune.Forcing``) never benchmarks; under the interpreter, which has no driver to
    time with, one normcert did not find dies there ("0 active drivers")."""
    where = getattr(sys.modules.get("triton.runtime.autotuner"), "__file__", None)
    tb = e.__traceback__
    while tb is not None:
        if (tb.tb_frame.f_code.co_name, tb.tb_frame.f_code.co_filename) == ("benchmark", where):
            return True
        tb = tb.tb_next
    return False


class _Inline:
    """``Worker``'s interface for a call in the calling thread, the kernel's importer (``kernel_code``)."""

    def __init__(self, impl):
        if threading.get_ident() != importer(impl):
            raise RuntimeError(f"{impl.id}: a call on its importer thread made from another thread")
        self.state = thread_state()

    def run(self, fn, timeout: float, progressed=lambda: None) -> Waited:
        start, first = time.monotonic(), interpreter.programs(threading.get_ident())
        fn()
        return Waited(True, time.monotonic() - start, interpreter.programs(threading.get_ident()) - first)

    def retire(self) -> None:
        """Put back the thread-local state torch lets be set (inference mode it does not)."""
        torch.set_autocast_enabled("cpu", self.state["autocast (cpu)"])
        torch.set_autocast_enabled("cuda", self.state["autocast (cuda)"])
        torch.set_flush_denormal(self.state["flush denormal"])
        torch.set_num_threads(self.state["intra-op threads"])


def thread_state() -> dict:
    """torch's per-thread modes a kernel could enter and never leave (``torch.inference_mode().__enter__()``
    without its exit): the next kernel in the same thread would run under them.  Flush-to-zero
    (``torch.set_flush_denormal``) is one: it sets the CPU's FTZ / DAZ bits of the calling thread only,
    the worker's, where the caller's check (``global_state``) never sees it.  torch's intra-op thread
    count is another (OpenMP's count is the calling thread's, and the one a thread started later
    inherits: ``kernel_code`` sets it back in the kernel's thread)."""
    return {"grad mode": torch.is_grad_enabled(), "inference mode": torch.is_inference_mode_enabled(),
            **{f"autocast ({d})": torch.is_autocast_enabled(d) for d in ("cpu", "cuda")},
            "flush denormal": flushes_denormals(), "intra-op threads": torch.get_num_threads()}


def _changes(before: dict, now: dict) -> str:
    return ", ".join(f"{k}: {before[k]} -> {now[k]}" for k in before if now[k] != before[k])


def global_state() -> dict:
    """torch's process-wide settings a kernel could change under the suite's feet.

    Grad mode, inference mode and autocast are per thread (``thread_state``: a kernel that
    leaves them changed fails, and the next call runs in a fresh thread); the RNG is restored
    without blame.  Flush-to-zero is per thread too, and in both: in the worker's state as what the
    kernel's call does, here as the state of the thread the oracle computes in (code of the
    kernel's, a finalizer run by the garbage collector, may still run in it).
    """
    return {"default dtype": torch.get_default_dtype(),
            "deterministic algorithms": (torch.are_deterministic_algorithms_enabled(),
                                         torch.is_deterministic_algorithms_warn_only_enabled()),
            "fill uninitialized memory": torch.utils.deterministic.fill_uninitialized_memory,
            "float32 matmul precision": torch.get_float32_matmul_precision(),
            "flush denormal": flushes_denormals()}


def restore_global_state(before: dict) -> str:
    """Put back what changed since ``before``; returns "what: old -> new, ..." or ""."""
    changed = _changes(before, global_state())
    if changed:
        torch.set_default_dtype(before["default dtype"])
        on, warn_only = before["deterministic algorithms"]
        torch.use_deterministic_algorithms(on, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = before["fill uninitialized memory"]
        torch.set_float32_matmul_precision(before["float32 matmul precision"])
        torch.set_flush_denormal(before["flush denormal"])
    return changed


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def invoke(session, impl, case: Case, within=None, mode: str = "", around=None,
           thread: str = "worker", cast: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """Call the kernel on ``case`` and enforce the output contract; returns its outputs as the values
    they hold (``record.Op.decode``: packed FP4 unpacked, swizzled scales read through their index
    map; the others as they are).  ``within``:
    a context factory entered around the call in the kernel's own thread (a calling mode,
    ``modes``: inference mode and autocast are per thread), ``mode`` its name; ``around``: one entered
    around the call in the calling thread (process-wide state: the default dtype); ``thread``: the
    thread the call runs in (``kernel_code``); ``cast``: a dtype the outputs may come back in instead
    of the case's (``shaped_outputs``: an autocast=casts kernel inside autocast, ``calling.casting``)."""
    info = case.record
    before = snapshot(case)
    args = case.oracle_args()

    def call():
        with within() if within is not None else contextlib.nullcontext():
            return info.call(impl.fn, args)

    with around() if around is not None else contextlib.nullcontext():
        out = kernel_code(session, impl, "", call, (case.dtype, torch.is_grad_enabled(), mode), thread=thread)
    outs = shaped_outputs(impl, case, args, out, cast)
    check_layouts(impl, case, outs)
    check_unmutated(impl, case, before)
    check_fresh(impl, case, info.outputs, outs)
    check_not_reused(session, impl, info.outputs, outs)
    outs = info.decode(outs, args)
    # the caller's own copies: a kernel that later writes into a buffer it kept cannot change
    # a result a property still holds (outputs with a graph stay: the gradients run through them)
    return tuple(o if o.requires_grad else o.clone() for o in outs)


def shaped_outputs(impl, case: Case, args: dict, out, cast: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """The kernel's return value ``out`` as the op's outputs, each of the shape, dtype and device
    the contract says (``ContractViolation`` otherwise); the tensors themselves, not copies.  With
    ``cast``, the outputs whose contract dtype is the case's may all be in ``cast`` instead (all or
    none of them: one case holds them)."""
    info = case.record
    outs = _normalise_outputs(impl, info, out)
    device = case.main.device
    casts = set()
    for name, o, shape in zip(info.outputs, outs, expected_shapes(case)):
        if tuple(o.shape) != shape:
            raise ContractViolation(f"{impl.id} returned {name} of shape {tuple(o.shape)}, expected {shape}")
        want = info.out_dtype(name, args)
        if cast is not None and want == case.dtype and o.dtype in (want, cast):
            casts.add(o.dtype == cast)
        elif o.dtype != want:
            raise ContractViolation(f"{impl.id} returned {name} of dtype {o.dtype}, expected {want}"
                                    + (f" or {cast} (autocast=casts)" if cast is not None and want == case.dtype else ""))
        if o.device != device:
            raise ContractViolation(f"{impl.id} returned {name} on {o.device}, expected {device}")
    if len(casts) > 1:
        raise ContractViolation(f"{impl.id} returned some outputs in {cast} and others in {case.dtype} inside "
                                f"autocast (autocast=casts: all of them in {cast}, or none)")
    return outs


HELD_CALLS = 2  # a kernel's outputs of this many earlier calls are kept alive to catch a reused buffer
HELD_BYTES = 1 << 26  # ... those of at most this many bytes (--profile large's cases would fill the device)


def check_not_reused(session, impl, names, outs) -> None:
    """No output lives in the storage of an output of the kernel's last ``HELD_CALLS`` calls.  Those
    outputs are held alive meanwhile, so a fresh allocation can never have their address: a shared
    storage is a buffer the kernel kept and wrote again (a static buffer, a ring of two), which
    would change a result its caller still holds."""
    held = session.returned.setdefault(impl.id, [])
    seen = {o.untyped_storage().data_ptr() for call in held for o in call if o.numel()}
    for name, o in zip(names, outs):
        if o.numel() and o.untyped_storage().data_ptr() in seen:
            raise ContractViolation(f"{impl.id} returned {name} in the storage of an output of one of its earlier "
                                    f"calls (a buffer it reuses: the earlier caller's result was overwritten)")
    if sum(o.untyped_storage().nbytes() for o in outs) <= HELD_BYTES:
        held.append(tuple(o.detach() for o in outs))
        del held[:-HELD_CALLS]


def _rehomed(out):
    """``out`` with each tensor in it (alone, or in a tuple or list) replaced by a new Python object
    over the same storage and graph: a detached alias, or a view where it carries a graph.  The
    kernel's own objects then die in the worker thread, under the watchdog, so a finalizer that
    blocks when an output is freed is a hang of the kernel's, not of the run.  (A leaf that requires
    grad, an input handed back, is kept: a view of it would gain a grad_fn.)"""
    if isinstance(out, (tuple, list)):
        return type(out)(_rehomed(o) for o in out) if type(out) in (tuple, list) else out
    if not plain(out) or (out.requires_grad and out.grad_fn is None):
        return out  # not a plain tensor: refused by the contract (``_normalise_outputs``), as it is
    return out.view_as(out) if out.requires_grad else out.detach()


def plain(o) -> bool:
    """A torch.Tensor itself: a subclass could run code of its own in every method the suite calls."""
    return type(o) in (torch.Tensor, torch.nn.Parameter)


def _normalise_outputs(impl, info, out):
    n = len(info.outputs)
    outs = (out,) if n == 1 else out
    if n == 1 and not isinstance(out, torch.Tensor):
        raise ContractViolation(f"{impl.id} returned {_kind(out)}, expected a tensor")
    if n > 1 and (not isinstance(out, (tuple, list)) or len(out) != n
                  or not all(isinstance(o, torch.Tensor) for o in out)):
        raise ContractViolation(f"{impl.id} returned {_kind(out)}, expected a tuple of {n} tensors")
    for o in outs:
        if not plain(o):
            raise ContractViolation(f"{impl.id} returned a {type(o).__name__} (a torch.Tensor subclass), "
                                    f"expected a plain torch.Tensor")
    return tuple(outs)


def _kind(out):
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}"
    return "None" if out is None else f"a {type(out).__name__}"

