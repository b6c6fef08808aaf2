"""Calling a kernel under test, and running one property over it with Hypothesis.

A kernel is untrusted.  ``invoke`` turns everything it can do wrong -- raise
anything (``SystemExit`` included; only ``KeyboardInterrupt`` passes), return
None or a tuple where a tensor is due, the wrong shape, dtype or device,
mutate an input -- into a ``ContractViolation`` that names the kernel and what
it did.  ``kernel_code`` does the same for the kernel's backward.

What a kernel supports is its declared domain (``impls.domain``): cases are
drawn inside it (``fitting``), a dtype outside it is ``not-supported`` without a
call, and ``NotImplementedError`` on any case inside it is a failure.  A kernel
that declares no domain may still refuse a whole dtype: it raises
NotImplementedError on the op's small sample (``probe``), and then on every
case drawn for that dtype (accepting one is a failure: support is not decided
by one fixed input); refusing some cases of a dtype it accepts is a failure
that says to declare the domain.

``run`` drives one property for one (implementation, dtype): it draws cases,
calls the property's check, keeps the worst error seen (and steers Hypothesis
towards it with ``target``), and on failure re-raises with the shrunk case,
the property, the dtype and the replay command.  Every run leaves a
``Result`` in its session's ``results`` for the certificate; it starts as ``error``
and becomes ``pass`` only when the search completed with every case checked.
Everything here takes the run's ``Session`` (settings, results, hung kernels)
as its first argument; the module holds no run state.
"""
from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis.errors import Flaky

from normcert import oracle
from normcert.oracle import assessment
from normcert.oracle.formats import DTYPE_NAMES

from .case import Case
from .families import BY_NAME
from .fitting import fit
from .replay import save_failure
from .session import FIRST_CALL


class ContractViolation(AssertionError):
    """The kernel broke the calling contract (not a numerical failure)."""


class PropertyFailure(AssertionError):
    """A property does not hold for the kernel on some case."""


class NotSupported(Exception):
    """The kernel raised NotImplementedError for this input; ``why``: its message."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why


# ------------------------------------------------------------------ invoking
def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the storage ``t`` views, not just the elements in its view."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).clone()


def snapshot(case: Case) -> dict:
    return {k: _storage_bytes(t) for k, t in case.tensors.items() if t is not None}


def check_unmutated(impl, case: Case, before: dict, chunk: int = 1 << 28) -> None:
    """The storage behind every input still holds the bytes of ``snapshot``: compared in place, a
    chunk of bytes at a time (a copy, or one comparison of the whole storage, would take as much
    device memory again as the input: ``--profile large`` cases fill the device)."""
    for k, raw in before.items():
        now = torch.empty(0, dtype=torch.uint8, device=raw.device).set_(case.tensors[k].untyped_storage())
        if now.numel() != raw.numel() or not all(torch.equal(now[a:a + chunk], raw[a:a + chunk])
                                                 for a in range(0, raw.numel(), chunk)):
            raise ContractViolation(f"{impl.id} mutated its input {k!r} (bits changed in its storage)")


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
    return [case.record.out_shape(tuple(case.main.shape))] * len(case.record.outputs)


class _Worker:
    """One long-lived daemon thread that runs kernel calls; abandoned when a call hangs in it.

    A thread per call would cost ~0.5 ms a call (thread start plus torch's
    per-thread set-up).  A daemon thread, not a ThreadPoolExecutor: the
    executor's threads are joined at interpreter exit, so a hung kernel would
    keep the process alive for ever.
    """

    def __init__(self):
        self.tasks = None

    def _start(self) -> None:
        tasks = queue.SimpleQueue()

        def loop():
            while True:
                fn, done = tasks.get()
                if fn is None:
                    return  # retired
                fn()  # never raises: kernel_code's call() keeps the exception
                done.set()
                del fn, done  # else the finished call's arguments live until the next call

        threading.Thread(target=loop, name="normcert-kernel", daemon=True).start()
        self.tasks = tasks

    def run(self, fn, timeout: float) -> bool:
        """Run ``fn`` in the worker; False if it is still running after ``timeout`` seconds."""
        if self.tasks is None:
            self._start()
        done = threading.Event()
        self.tasks.put((fn, done))
        if done.wait(timeout):
            return True
        self.tasks = None  # its thread is stuck in the kernel; the next call starts a new one
        return False

    def retire(self) -> None:
        """Leave the current thread behind: the next call starts a new one."""
        if self.tasks is not None:
            self.tasks.put((None, None))
            self.tasks = None


_WORKER = _Worker()


class KernelHung(ContractViolation):
    """The kernel gave no result within --kernel-timeout; it is not called again in this process."""


def kernel_code(session, impl, what: str, thunk, specialisation=None):
    """``thunk()`` (a call into kernel code) under the watchdog; its failures are the kernel's.

    The call runs in a worker thread (``_Worker``), with the caller's grad mode, and is given
    ``session.kernel_timeout`` seconds; the first call of ``what`` for a ``specialisation``
    (dtype, grad mode) in this process, FIRST_CALL times that: torch.compile and Triton compile
    there (on an H100 with 15 xdist workers compiling at once, a compiled add_rms_norm's first
    backward took more than 60 s).  Past that the kernel is marked hung in
    ``session.hung``: this call and every later one fail at once with "hung: no result
    after T s" (the thread cannot be killed; it is left behind and dies with the
    process).  Any exception but KeyboardInterrupt is a ``ContractViolation``
    naming the kernel; NotImplementedError is ``NotSupported`` (a refusal).
    torch's global state (``global_state``) is restored after the call, and a
    kernel that changed it is a ``ContractViolation`` too.
    """
    box: dict = {}
    grad = torch.is_grad_enabled()

    def call():
        try:
            with torch.set_grad_enabled(grad):
                before = thread_state()
                try:
                    box["value"] = thunk()
                finally:
                    box["leaked"] = _changes(before, thread_state())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below, as words:
            box["error"] = type(e)  # its message is made here, under the watchdog (a __str__ may block)
            try:
                box["text"] = _first_line(e)
            except BaseException:  # noqa: BLE001 - a __str__ that raises
                box["text"] = "(its message could not be formatted)"

    before, rng = global_state(), torch.get_rng_state()
    key = (impl.id, what, specialisation)
    limit = session.kernel_timeout * (1 if key in session.called else FIRST_CALL)
    if impl.id not in session.hung and not _WORKER.run(call, limit):
        session.hung[impl.id] = f"{impl.id}{what} hung: no result after {limit:g} s"
    session.called.add(key)
    session.beat()
    if impl.id in session.hung:
        # one raise for the call that hung and every later one: Hypothesis replays a failing
        # example and calls a failure raised from another line a different ("flaky") one
        raise KernelHung(session.hung[impl.id])
    changed = restore_global_state(before)
    torch.set_rng_state(rng)  # a kernel that draws random numbers must not shift later draws
    if box.get("leaked"):
        _WORKER.retire()  # its thread-local state is the kernel's now: the next call gets a fresh thread
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
    raise ContractViolation(f"{impl.id}{what} raised {error.__name__}: {box['text']}")


def _flushes_denormals() -> bool:
    return torch.tensor([2.0 ** -1070], dtype=torch.float64).mul(1.0).item() == 0.0


def thread_state() -> dict:
    """torch's per-thread modes a kernel could enter and never leave (``torch.inference_mode().__enter__()``
    without its exit): the next kernel in the same thread would run under them."""
    return {"grad mode": torch.is_grad_enabled(), "inference mode": torch.is_inference_mode_enabled(),
            **{f"autocast ({d})": torch.is_autocast_enabled(d) for d in ("cpu", "cuda")}}


def _changes(before: dict, now: dict) -> str:
    return ", ".join(f"{k}: {before[k]} -> {now[k]}" for k in before if now[k] != before[k])


def global_state() -> dict:
    """torch's process-wide settings a kernel could change under the suite's feet.

    Grad mode, inference mode and autocast are per thread (``thread_state``: a kernel that
    leaves them changed fails, and the next call runs in a fresh thread); the RNG is restored
    without blame.
    """
    return {"default dtype": torch.get_default_dtype(),
            "deterministic algorithms": (torch.are_deterministic_algorithms_enabled(),
                                         torch.is_deterministic_algorithms_warn_only_enabled()),
            "float32 matmul precision": torch.get_float32_matmul_precision(),
            "flush denormal": _flushes_denormals()}


def restore_global_state(before: dict) -> str:
    """Put back what changed since ``before``; returns "what: old -> new, ..." or ""."""
    changed = _changes(before, global_state())
    if changed:
        torch.set_default_dtype(before["default dtype"])
        on, warn_only = before["deterministic algorithms"]
        torch.use_deterministic_algorithms(on, warn_only=warn_only)
        torch.set_float32_matmul_precision(before["float32 matmul precision"])
        torch.set_flush_denormal(before["flush denormal"])
    return changed


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def invoke(session, impl, case: Case) -> tuple[torch.Tensor, ...]:
    """Call the kernel on ``case`` and enforce the output contract; returns its outputs."""
    info = case.record
    before = snapshot(case)
    args = case.oracle_args()
    out = kernel_code(session, impl, "", lambda: info.call(impl.fn, args), (case.dtype, torch.is_grad_enabled()))
    outs = _normalise_outputs(impl, info, out)
    device = case.main.device
    for name, o, shape in zip(info.outputs, outs, expected_shapes(case)):
        if tuple(o.shape) != shape:
            raise ContractViolation(f"{impl.id} returned {name} of shape {tuple(o.shape)}, expected {shape}")
        if o.dtype != info.out_dtype(name, case.dtype):
            raise ContractViolation(f"{impl.id} returned {name} of dtype {o.dtype}, "
                                    f"expected {info.out_dtype(name, case.dtype)}")
        if o.device != device:
            raise ContractViolation(f"{impl.id} returned {name} on {o.device}, expected {device}")
    check_unmutated(impl, case, before)
    check_fresh(impl, case, info.outputs, outs)
    check_not_reused(session, impl, info.outputs, outs)
    # the caller's own copies: a kernel that later writes into a buffer it kept cannot change
    # a result a property still holds (outputs with a graph stay: the gradients run through them)
    return tuple(o if o.requires_grad else o.clone() for o in outs)


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


def _plain(o) -> bool:
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
        if not _plain(o):
            raise ContractViolation(f"{impl.id} returned a {type(o).__name__} (a torch.Tensor subclass), "
                                    f"expected a plain torch.Tensor")
    return tuple(outs)


def _kind(out):
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}"
    return "None" if out is None else f"a {type(out).__name__}"


# ------------------------------------------------------------------ measuring
@dataclass
class Worst:
    """The worst error a run has seen, in model units and in ulps, and where."""

    units: float = 0.0
    ulps: float = 0.0
    where: str = ""
    unclaimed: int = 0
    example_units: float = 0.0  # worst of the current example: what Hypothesis climbs
    exact: int = 0  # quantised outputs checked against the oracle: bit-exact ones ...
    checked: int = 0  # ... of these

    def add(self, a: assessment.Assessment, case: Case) -> None:
        self.unclaimed += a.unclaimed
        if np.isfinite(a.max_units):
            self.example_units = max(self.example_units, a.max_units)
        self.ulps = max(self.ulps, a.max_ulps)
        if a.max_units >= self.units:
            self.units = a.max_units
            self.where = f"{a.detail} on {case.describe()}"


def check_against_oracle(outs, case: Case, worst: Worst, where=None, label="") -> None:
    """Every output within the error model's bound of the exact value."""
    args = case.oracle_args()
    exact = oracle.forward(case.op, **args)
    rec = case.record
    bounds = rec.forward_bound(args, exact)
    nan_ok = rec.indeterminate(args) if rec.indeterminate else None
    for name, o, e, b in zip(rec.outputs, outs, exact, bounds):
        a = assessment.assess(label + name, o, e, b, rec.out_dtype(name, case.dtype), where=where, nan_ok=nan_ok,
                               quantised=rec.quantised_dtype(name) is not None)
        worst.exact, worst.checked = worst.exact + a.exact, worst.checked + a.checked
        record_assessment(a, case, worst)


def check_pair(label: str, name: str, actual, other, tol, case: Case, worst: Worst, where=None) -> None:
    """Output ``name`` of one call (``actual``) within ``tol`` of another call's (``other``), tol
    bounding how far apart the two may be before any rounding to a quantised format
    (``assessment.pair_reference``)."""
    rec = case.record
    quantised = rec.quantised_dtype(name) is not None
    ref, bound = assessment.pair_reference(other, tol, quantised)
    a = assessment.assess(label, actual, ref, bound, rec.out_dtype(name, case.dtype), where=where,
                           quantised=quantised)
    record_assessment(a, case, worst)


def record_assessment(a: assessment.Assessment, case: Case, worst: Worst) -> None:
    worst.add(a, case)
    if not a.ok:
        raise PropertyFailure(a.detail)


# ------------------------------------------------------------------ running
@dataclass
class Result:
    impl: str
    op: str
    backend: str
    prop: str
    dtype: str
    outcome: str  # error (until the check completes) | pass | fail | not-supported | not-certified |
    #               expected-fail | warn
    examples: int = 0
    refused: int = 0  # drawn cases the kernel refused with NotImplementedError
    domain: str = ""  # what the checked (not refused) cases covered
    seconds: float = 0.0
    worst_units: float = 0.0
    worst_ulps: float = 0.0
    worst_where: str = ""
    unclaimed: int = 0
    message: str = ""
    replay: str = ""


def on_sample(session, impl, dtype, *, grads=False, weightless=False):
    """Call the kernel once on the op record's small sample input (2 rows of 4, fitted into its
    declared domain) under
    ``kernel_code``; with ``grads``, in grad mode with the inputs that get gradients requiring
    grad; with ``weightless``, the op's optional weight and bias given as None.  Returns (outcome,
    outputs, launches): outcome "ok", "refused" (NotImplementedError) or "broke" (raised or hung:
    the properties report it); launches: Triton interpreter launches."""
    from normcert.impls import interpreter  # noqa: PLC0415

    rec = oracle.OPS[impl.op]
    args = fit(Case.sample(impl.op, dtype, session.device, rows=2, width=4), impl.domain).oracle_args()
    if weightless:
        args.update({k: None for k in rec.optional})
    if grads:
        args.update({k: args[k].detach().requires_grad_(True) for k in rec.grads})
    before = interpreter.launches()
    try:
        with torch.enable_grad() if grads else contextlib.nullcontext():
            outputs = kernel_code(session, impl, "", lambda: rec.call_outputs(impl.fn, args),
                                  (dtype, grads, weightless))
        outcome = "ok"
    except NotSupported:
        outputs, outcome = (), "refused"
    except ContractViolation:
        outputs, outcome = (), "broke"
    return outcome, outputs, interpreter.launches() - before


def probe(session, impl, dtype) -> bool:
    """Does the kernel accept this dtype at all? (not NotImplementedError on the op's sample)"""
    return on_sample(session, impl, dtype)[0] != "refused"


def has_backward(session, impl, dtype) -> bool:
    """Do the kernel's outputs carry a grad_fn on the op record's sample input, with the
    inputs that get gradients requiring grad?  (A kernel that refuses the sample or
    breaks on it has its say in the properties themselves: True.)"""
    outcome, outputs, _ = on_sample(session, impl, dtype, grads=True)
    return outcome != "ok" or any(getattr(o, "grad_fn", None) is not None for o in outputs)


def runs_interpreted(session, impl, dtype) -> bool:
    """Does the kernel run under Triton's interpreter here (it launched a kernel there on the op's
    sample input)?  Then every program of its grid is a Python loop iteration.  Decided by the
    launch count, not by ``session.interpreter``: a session built by hand has no corrections
    listed, and its Triton kernels are interpreted all the same."""
    key = (impl.id, DTYPE_NAMES[dtype])
    if key not in session.interpreted:
        session.interpreted[key] = on_sample(session, impl, dtype)[2] > 0
    return session.interpreted[key]


def accepts_weightless(session, impl, dtype) -> bool:
    """Does the kernel take None for its op's optional weight and bias (``oracle.record``)?  Asked
    once, on the op's sample: a kernel that raises there (most do: ``weight.float()`` on None) was
    not written for weightless calls, which is no defect, and its cases give the identity (ones,
    zeros) instead of None; its certificate's domain says so.  One that returns is checked on
    weightless calls like any other (a kernel that reads None as zeros fails accuracy)."""
    key = (impl.id, DTYPE_NAMES[dtype])
    if key not in session.weightless:
        session.weightless[key] = on_sample(session, impl, dtype, weightless=True)[0] == "ok"
    return session.weightless[key]


def backward_gate(session, family, impl, dtype) -> None:
    """Before a family that checks the backward: a kernel registered without one skips; a
    kernel whose outputs carry no grad_fn is not certified by the family (forward only), and
    fails it where it was registered with a backward or under --require-backward.  Forward-only
    status, like support, is not decided by the op's sample alone: the gradients family's own
    cases (the same seeds) must carry no grad_fn either (``_no_grad_fn``), else the kernel fails."""
    import pytest  # noqa: PLC0415

    if impl.backward is False:
        pytest.skip(f"{impl.id} is registered without backward")
    # a calling convention (@inplace, @out, @outkw) is an inference one: a kernel called so is
    # forward only unless a backward is asked for (its copy_ into the buffers may record a partial graph)
    by_convention = bool(impl.convention) and not (impl.backward or session.require_backward)
    if not by_convention and has_backward(session, impl, dtype):
        return
    why = "registered with backward" if impl.backward else "--require-backward" if session.require_backward else ""
    if why:
        res = Result(impl.id, impl.op, impl.backend, family.name, DTYPE_NAMES[dtype], "fail",
                     message=f"{why}, but its outputs carry no grad_fn")
        session.results.append(res)
        pytest.fail(f"{family.name} fails for {impl.id} in {res.dtype}: {res.message}", pytrace=False)
    if by_convention:
        reason = f"@{impl.convention} is an inference calling convention"
        res = Result(impl.id, impl.op, impl.backend, family.name, DTYPE_NAMES[dtype], "not-certified")
        session.results.append(res)
    else:
        reason = "its outputs carry no grad_fn"
        gradients = BY_NAME["gradients"]
        try:
            res = run(session, family.name, impl, dtype, gradients.strategy(impl.op, dtype, session.device),
                      _no_grad_fn)
        except PropertyFailure as e:
            pytest.fail(str(e), pytrace=False)
        if res.outcome == "not-supported":
            pytest.skip(f"not-supported: {impl.id} {res.message}")
        res.outcome = "not-certified"
    res.message = f"forward only: {reason}, so its backward was not checked"
    pytest.skip(f"not-certified (forward only): {impl.id}: {reason}; --require-backward makes this a failure")


def _no_grad_fn(session, impl, case, worst):
    """A forward-only kernel's outputs carry no grad_fn on this case either (inputs requiring grad)."""
    live = case.replace(**{k: case.tensors[k].detach().clone().requires_grad_(True)
                           for k in case.record.grads_in(case.tensors)})
    with torch.enable_grad():
        outs = invoke(session, impl, live)
    carrying = [name for name, o in zip(case.record.outputs, outs) if o.grad_fn is not None]
    if carrying:
        raise PropertyFailure(f"{', '.join(carrying)} carries a grad_fn on this case but none on the op's sample "
                              f"(2 rows): forward-only must hold on every case, or its backward goes unchecked")


class Coverage:
    """What the checked cases covered (or, for a dtype the kernel does not support, refused)."""

    def __init__(self):
        self.examples = self.refused = self.rows = self.width = self.numel = 0
        self.layouts: set[str] = set()
        self.buckets: list[str] = []
        self.batch_sizes: set[int] = set()
        self.weightless = ""  # where the op has an optional weight / bias: "taken", or "filled" (ones for None)
        self.nones = 0  # cases checked with an optional weight or bias given as None

    def checked(self, case: Case) -> None:
        main = case.main
        width = main.shape[-1] if main.dim() else 1
        self.rows = max(self.rows, main.numel() // max(width, 1))
        self.width = max(self.width, width)
        self.numel = max(self.numel, main.numel())
        self.layouts.add("contiguous" if main.is_contiguous() else "strided")
        self.nones += any(case.tensors.get(k) is None for k in case.record.optional)
        if "bucket" in case.notes:
            self.buckets.append(case.notes["bucket"])
        if "batch sizes" in case.notes:
            self.batch_sizes.update(int(s) for s in case.notes["batch sizes"].split("/"))

    def refuse(self) -> None:
        self.refused += 1

    @property
    def domain(self) -> str:
        if not self.layouts:  # no case checked
            return f"nothing checked: refused {self.refused} of {self.examples} cases" if self.refused \
                else "nothing checked"
        text = (f"rows <= {self.rows}, row length <= {self.width}, largest call {self.numel} elements, "
                f"layouts: {'/'.join(sorted(self.layouts))}")
        if self.buckets:
            text += f"; buckets: {', '.join(self.buckets)}"
        if self.batch_sizes:
            text += f"; batch sizes: {', '.join(map(str, sorted(self.batch_sizes)))}"
        if self.weightless == "taken":
            text += f"; weightless calls (None weight / bias): {self.nones} cases"
        elif self.weightless == "filled":
            text += "; weightless calls not accepted (raised on None): None given as ones / zeros"
        return text


def scheduled(session, family, impl, dtype) -> tuple:
    """The family's buckets (``strategies.buckets``) for this kernel and dtype, spun by the run's seed.
    The "million" bucket (one call past 2**20 elements) is scheduled in one dtype of the kernel's
    domain per run, rotating with the seed: a call that size costs seconds under Triton's interpreter."""
    from .strategies import buckets, large_buckets  # noqa: PLC0415

    if not family.buckets or not family.applies(oracle.OPS[impl.op]) or not impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
        return ()
    spin = session.derive_seed(impl.op, family.name, DTYPE_NAMES[dtype], "buckets")
    if family.profile == "large":
        return large_buckets(oracle.OPS[impl.op], spin)
    interpreted = "many" in family.buckets and runs_interpreted(session, impl, dtype)
    admitted = [d for d in DTYPE_NAMES.values() if impl.domain.admits_dtype(d)]
    million = admitted[session.derive_seed(impl.op, family.name, "million") % len(admitted)]
    return tuple(b for b in buckets(oracle.OPS[impl.op], spin, interpreted) if b.name in family.buckets
                 and (b.name != "million" or million == DTYPE_NAMES[dtype]))


def run_family(session, family, impl, dtype, *, max_examples=None, gating=True) -> Result:
    """``run`` of a property family (``families.Family``): its random search (none for a family
    of a profile), then its buckets."""
    schedule = [(b.label, family.strategy(impl.op, dtype, session.device, bucket=b))
                for b in scheduled(session, family, impl, dtype)]
    search = None if family.profile else family.strategy(impl.op, dtype, session.device)
    return run(session, family.name, impl, dtype, search, family.check_fn(), max_examples=max_examples,
               gating=gating, buckets=schedule)


_NO_SHRINK = tuple(p for p in Phase if p not in (Phase.shrink, Phase.explain))


def run(session, prop: str, impl, dtype, strategy, check, *, max_examples=None, gating=True, buckets=()) -> Result:
    """Run ``check(session, impl, case, worst)`` over ``strategy`` (``max_examples`` cases, default:
    the profile's; None: no random search), then over each (label, strategy) of ``buckets`` (one
    case each: the first one Hypothesis tries, not shrunk); record and raise on failure.  A
    non-gating run (a bitwise family without --bitwise) reports a failure as a warning and does
    not shrink it: shrinking re-runs the kernel hundreds of times for a case that fails nothing;
    nor is a case study's expected failure shrunk, outside ``--profile thorough``."""
    outside = outside_domain(session, impl, prop, dtype)
    if outside:
        return outside
    res = Result(impl.id, impl.op, impl.backend, prop, DTYPE_NAMES[dtype], "error")
    session.results.append(res)
    domain = impl.domain
    supported = probe(session, impl, dtype)
    if not supported and domain.declared:
        res.outcome = "fail"
        res.message = f"refused the op's sample (2 rows) inside its declared domain ({domain.describe()})"
        raise PropertyFailure(f"{prop} fails for {impl.id} ({impl.backend}) in {res.dtype}: {res.message}")
    if not supported:  # the whole dtype refused: every case must be refused too
        check = _refuses(res.dtype)
    # a failure is shrunk to a small case, at the price of re-running kernel and oracle hundreds of
    # times; not where the failure decides nothing (a bitwise family without --bitwise) or is the
    # expected verdict on a case study (most of the suite's time went to shrinking those), unless
    # --profile thorough asks for their minimal cases
    shrinks_not = ("a warning" if not gating else
                   "a case study, expected to fail; --profile thorough shrinks it"
                   if impl.expected_failure and session.profile != "thorough" else "")
    shrinks = not shrinks_not
    worst = Worst()
    cover = Coverage()
    state = {}
    in_domain = functools.partial(fit, domain=domain)
    if oracle.OPS[impl.op].optional:  # a dtype refused on the sample: whether None is taken is unknown
        taken = domain.weightless if domain.weightless is not None else \
            supported and accepts_weightless(session, impl, dtype)
        cover.weightless = "taken" if taken else "filled"
        if not taken:
            in_domain = lambda case: fit(case, domain).with_identity()  # noqa: E731
    strategy = None if strategy is None else strategy.map(in_domain)
    buckets = [(label, strat.map(in_domain)) for label, strat in buckets]

    overrides = {"suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
                 # too_slow: an 8192-wide row through the Triton interpreter is slow by design;
                 # data_too_large: the case strategy draws many structural choices on purpose.
                 "deadline": None, "report_multiple_bugs": False}

    def search(strat, examples, *seed_parts, **more):
        @seed(session.derive_seed(impl.op, prop, DTYPE_NAMES[dtype], *seed_parts))
        @settings(**overrides, **more, **({} if examples is None else {"max_examples": examples}))
        @given(case=strat)
        def body(case):
            cover.examples += 1
            worst.example_units = 0.0
            try:
                check(session, impl, case, worst)
            except NotSupported as e:
                if not supported:
                    cover.refuse()
                    return
                state["failed"] = (case, _refusal(domain, e))
                raise PropertyFailure(state["failed"][1]) from None
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                state["failed"] = (case, _first_line(e) or type(e).__name__)
                raise
            finally:
                target(min(worst.example_units, 1e6), label="error / bound")
            cover.checked(case)

        body()

    t0 = time.perf_counter()
    try:
        if strategy is not None:
            search(strategy, max_examples, **({} if shrinks else {"phases": _NO_SHRINK}))
        for label, strat in buckets:
            # no shrinking: the bucket fixes the shape, and each step would re-run a large case
            search(strat, 1, label, phases=(Phase.generate,))
        res.outcome = "pass" if supported else "not-supported"
        if not supported:
            res.message = f"raises NotImplementedError for {res.dtype}: on the op's sample and all {cover.examples} cases"
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - AssertionError is a failure; anything else an error
        # Flaky: a case failed, then passed or failed otherwise when Hypothesis ran it
        # again -- the kernel's answer changes from call to call, itself a failure
        failure = isinstance(e, (AssertionError, Flaky))
        res.outcome = ("fail" if gating else "warn") if failure else "error"
        case, res.message = state.get("failed") or (None, _first_line(e) or type(e).__name__)
        if isinstance(e, Flaky):
            res.message = f"nondeterministic: the same case gave another result when run again ({res.message})"
        elif not failure:
            res.message = f"{type(e).__name__} while checking: {res.message}"
        if case is not None:
            res.worst_where = case.describe()
            res.replay = save_failure(impl, prop, case, session.failures_dir)
        if gating or not failure:
            raise PropertyFailure(
                f"{prop} fails for {impl.id} ({impl.backend}) in {DTYPE_NAMES[dtype]}: {res.message}\n"
                f"  {'shrunk case' if shrinks else 'first failing case (not shrunk: ' + shrinks_not + ')'}: "
                f"{res.worst_where}\n  replay: {res.replay}"
            ) from None
    finally:
        res.seconds = time.perf_counter() - t0
        res.examples, res.refused, res.domain = cover.examples, cover.refused, cover.domain
        if worst.checked:
            res.domain += (f"; quantised outputs bit-exact (the exactly rounded value): "
                           f"{worst.exact} of {worst.checked} ({100 * worst.exact / worst.checked:.2f}%)")
        res.worst_units, res.worst_ulps, res.unclaimed = worst.units, worst.ulps, worst.unclaimed
        if res.outcome == "pass":
            res.worst_where = worst.where
    return res


def outside_domain(session, impl, prop: str, dtype) -> Result | None:
    """A ``not-supported`` result, recorded, where ``dtype`` is outside the kernel's declared domain
    (the kernel is not called); None inside it."""
    if impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
        return None
    res = Result(impl.id, impl.op, impl.backend, prop, DTYPE_NAMES[dtype], "not-supported",
                 message=f"outside its declared domain ({impl.domain.describe()})")
    session.results.append(res)
    return res


def _refusal(domain, e: NotSupported) -> str:
    if domain.declared:
        return f"refused a case inside its declared domain ({domain.describe()}): {e.why}"
    return (f"refused a case of a dtype it accepts: {e.why}; a kernel that supports part of the op declares "
            f"its domain (normcert_domain on the kernel, or --domain), and is certified on it")


def _refuses(dtype_name: str):
    """The check for a dtype whose sample the kernel refused: it must refuse every case."""
    def check(session, impl, case, worst):
        invoke(session, impl, case)  # NotSupported: consistent
        raise PropertyFailure(f"refused the op's sample in {dtype_name} (NotImplementedError) but accepted this "
                              f"case: support must hold for the whole dtype, or be declared (normcert_domain)")
    return check


def certify(session, family, impl, dtype) -> Result:
    """``run`` of a property family (``families.Family``) as a pytest test: not-supported
    skips, a case study's failure is expected, a bitwise family gates only under --bitwise."""
    import warnings  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    prop = family.name
    if family.backward:
        backward_gate(session, family, impl, dtype)
    gating = session.bitwise if family.bitwise else True
    try:
        res = run_family(session, family, impl, dtype, gating=gating)
    except PropertyFailure as e:
        if impl.expected_failure:
            session.results[-1].outcome = "expected-fail"
            pytest.xfail(f"{impl.expected_failure} | {e}")
        pytest.fail(str(e), pytrace=False)  # the message is the report; the suite's frames are noise
    if res.outcome == "not-supported":
        pytest.skip(f"not-supported: {impl.id} {res.message}")
    if res.outcome == "warn":
        warnings.warn(f"{prop} (not gating without --bitwise): {impl.id} in {res.dtype}: {res.message}", stacklevel=2)
    return res
