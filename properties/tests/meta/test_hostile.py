"""Hostile kernels get the verdict they earn, never "pass" for what was not checked.

Each runs one property in-process through ``runner.run`` (the path every test
takes) and asserts the Result the certificate would carry.
"""
from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import threading
import time
import warnings
import weakref

import numpy as np
import pytest
import torch

from .... import impls
from ....impls import eager, flushes_denormals, make
from ....oracle.formats import fmt
from ...harness import interpreter, pulse
from ...declared.conventions import ConventionViolation
from ...run import runner
from ...harness import sandbox
from ...search import strategies
from ...search.case import extent
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.run_settings import PROGRESSING
from ...families.accuracy import check_accuracy
from ...families.bitwise import check_determinism
from ...families.gradcheck import finite_differences, gradcheck_case, which_side
from ...families.gradients import check_gradients, gradient_cases
from ...run.outcomes import certify
from ...harness.session import Session

from . import hostile

F32 = torch.float32


def _impl(fn):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.hostile:{fn.__name__}")


@pytest.fixture
def session(tmp_path):
    """A session of the test's own: CPU, seed 0, replay files in tmp_path."""
    return Session(failures_dir=str(tmp_path))


def _accuracy(session, fn, check=check_accuracy):
    strategy = strategies.cases("rms_norm", F32, "cpu", profiles=("normal",), hostile=False)
    return runner.run(session, "accuracy", _impl(fn), F32, strategy, check, max_examples=30)


def test_refusing_cases_after_the_probe_fails(session):
    with pytest.raises(PropertyFailure, match="refused a case of a dtype it accepts: only 2x4; a kernel that "
                                              "supports part of the op declares its domain"):
        _accuracy(session, hostile.rms_refuses_after_probe)
    res = session.results[-1]
    assert res.outcome == "fail" and res.domain == "nothing checked" and res.replay.startswith("normcert replay ")


def test_system_exit_is_a_contract_failure(session):
    with pytest.raises(PropertyFailure, match="rms_exits raised SystemExit"):
        _accuracy(session, hostile.rms_exits)
    assert session.results[-1].outcome == "fail" and session.results[-1].replay.startswith("normcert replay ")


def test_a_raising_backward_is_a_contract_failure(session):
    with pytest.raises(PropertyFailure, match="backward raised RuntimeError: backward exploded"):
        runner.run(session, "gradients", _impl(hostile.rms_backward_raises), F32, gradient_cases("rms_norm", F32, "cpu"),
                    check_gradients, max_examples=10)


def test_a_tensor_subclass_output_is_a_contract_failure(session):
    with pytest.raises(PropertyFailure, match="torch.Tensor subclass"):
        _accuracy(session, hostile.rms_hostile_output)


def test_an_exception_while_checking_is_an_error_not_a_pass(session):
    def broken_check(session, impl, case, worst):
        raise ValueError("the assessment broke")

    with pytest.raises(PropertyFailure, match="accuracy could not be checked for rms_norm:rms_refuses_long_rows "
                                              r"\(plugin\) in float32: normcert's own error, not the kernel's: "
                                              "ValueError in its checking code: the assessment broke"):
        _accuracy(session, hostile.rms_refuses_long_rows, check=broken_check)
    assert session.results[-1].outcome == "error"


def test_normcert_s_own_arithmetic_raises_no_warning(session):
    """Under PYTHONWARNINGS=error a warning from the bounds (0 inf on an infinite row, an overflowing
    sum) would be an exception in the checking code: a correct kernel's extremes pass without one."""
    extremes = BY_NAME["extremes"]
    impl = make("layer_norm", "eager", "plugin", eager.layer_norm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = runner.run(session, "extremes", impl, F32, extremes.cases("layer_norm", F32, "cpu"), extremes.check,
                         max_examples=10)
    assert res.outcome == "pass"


def test_a_hang_fails_its_own_result_only(session):
    """A kernel that hangs once, on one long row: that result fails (the same "hung" message when
    Hypothesis replays the example: not "nondeterministic"), and its next result runs in a fresh
    thread and passes; the hung call is not called again within its own result."""
    session.kernel_timeout = 0.5
    calls, release = [], threading.Event()

    def rms_hangs_once(x, weight, eps):
        calls.append(x.shape)
        if x.shape[-1] > 64 and not release.is_set():
            release.wait()  # until the end of the test
        return hostile._rms(x, weight, eps)

    try:
        with pytest.raises(PropertyFailure, match="hung: no result after 0.5 s"):
            _accuracy(session, rms_hangs_once)
        hung = [shape for shape in calls if shape[-1] > 64]
        assert len(hung) == 1, hung
        message = session.results[-1].message
        assert session.results[-1].outcome == "fail" and message.endswith("rms_hangs_once hung: no result after 0.5 s")
        assert f"x: float32{tuple(hung[0])}" in session.results[-1].worst_where  # the case it hung on, not a shrunk one
        release.set()  # the abandoned thread ends; the kernel no longer hangs
        before = len(calls)
        assert _accuracy(session, rms_hangs_once).outcome == "pass"
        assert len(calls) > before
    finally:
        release.set()


def test_a_slow_interpreted_call_that_advances_is_not_hung(session):
    """Under Triton's interpreter a launch's programs run one after the other: a call past its limit
    whose programs keep starting is slow, not hung, and its result says so."""
    pytest.importorskip("triton")
    from . import slow_triton  # noqa: PLC0415 - imports triton

    if not interpreter.active():
        pytest.skip("a GPU: no interpreter to count programs in")
    session.kernel_timeout = 0.5
    impl = _impl(hostile._rms)
    x = torch.randn(24, 8)
    sandbox.kernel_code(session, impl, "", lambda: slow_triton.copy_rows(x[:1]), F32)  # the first call: compiles
    t0 = time.perf_counter()
    assert torch.equal(sandbox.kernel_code(session, impl, "", lambda: slow_triton.copy_rows(x), F32), x)
    assert time.perf_counter() - t0 > 24 * slow_triton.PAUSE > session.kernel_timeout
    message = runner.record(session, impl, "accuracy", "float32", "pass").message
    assert message.startswith("slow, not hung: a call took ") and "(24 programs)" in message, message


def _touched(heartbeat, work, seconds: float) -> bool:
    """Was ``heartbeat`` touched by a pulse (every 0.05 s) while ``work`` ran in a thread of its own
    (for at most ``seconds``)?"""
    os.utime(heartbeat, (0, 0))
    pulse.start(str(heartbeat), period=0.05)
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(seconds)
    time.sleep(0.2)
    return os.path.getmtime(heartbeat) > 0


def test_the_pulse_beats_while_interpreted_programs_run_where_no_watchdog_looks(tmp_path):
    """A call outside the worker (the importer thread, a kernel's own thread) gives no beat until it
    returns: the pulse beats while the interpreter starts its programs; a thread that blocks does not."""
    pytest.importorskip("triton")
    from . import slow_triton  # noqa: PLC0415 - imports triton

    if not interpreter.active():
        pytest.skip("a GPU: no interpreter to count programs in")
    x = torch.randn(16, 8)
    slow_triton.copy_rows(x[:1])  # compiled
    interpreter.programs(threading.get_ident())  # the count installed, as a watched call installs it
    (tmp_path / "beat").write_text("")
    assert _touched(tmp_path / "beat", lambda: slow_triton.copy_rows(x), 5.0)
    (tmp_path / "still").write_text("")
    assert not _touched(tmp_path / "still", lambda: threading.Event().wait(0.6), 0.6)


def test_a_thread_that_takes_an_ended_thread_s_ident_is_not_news_to_the_pulse(monkeypatch):
    """CPython hands an ended thread's ident to the next thread: the count kept under it is the
    ended thread's, and a thread first seen with it has not advanced (a quick tier's pulse beat
    beside a thread that only waited, where the pulse first looked before the thread began)."""
    release = threading.Event()
    waiter = threading.Thread(target=release.wait, daemon=True)
    waiter.start()
    try:
        monkeypatch.setattr(interpreter, "programs_so_far", lambda ident: 16 if ident == waiter.ident else 0)
        seen: dict = {}
        pulse.advancing(seen)
        seen.pop(waiter.ident)  # the pulse looked before the waiter began
        assert not pulse.advancing(seen)
        assert seen[waiter.ident] == 16 and not pulse.advancing(seen)
    finally:
        release.set()


PULSE_BESIDE_AN_IMPORT = """
import importlib.abc, os, sys, types
os.environ["TRITON_INTERPRET"] = "1"
from normcert.properties.harness import interpreter, pulse
tried = []

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        tried.append(name)

sys.meta_path.insert(0, Watch())
half = sys.modules["triton"] = types.ModuleType("triton")  # another thread's import of triton, half made
half.__path__ = []  # a package: an import of a part of it asks the finders
pulse.advancing({})
print([name for name in tried if name.startswith("triton")])
"""


def test_the_pulse_imports_nothing_beside_an_import_of_triton():
    """The pulse runs beside the run's threads: where one of them is importing triton (the certificate's
    versions, a kernel's first call), an import of a part of triton from the pulse could hand that
    thread a half-made module ("module 'triton.language' has no attribute 'core'", seen once in an eager
    kernel's certify); the pulse reads the interpreter's counts without importing."""
    ran = subprocess.run([sys.executable, "-c", PULSE_BESIDE_AN_IMPORT], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.strip() == "[]", ran.stdout + ran.stderr


PULSE_WHILE_A_LOCAL_IS_FREED = """
import gc, sys, threading
from normcert.properties.harness import pulse

class Holder:
    pass

def garbage():  # a cycle holding a threading.local, as Hypothesis's engine holds its caches' locals
    h = Holder(); h.local = threading.local(); h.local.x = 1; h.self = h

armed = [1]
def after_a_collection(phase, info):  # the garbage made just after the collection the frames' dict starts
    if phase == "stop" and armed:
        armed.pop()
        for _ in range(5):
            garbage()

ev = threading.Event()
for _ in range(3):  # threads whose frames have no frame object yet: reading them allocates
    threading.Thread(target=lambda: ev.wait(), daemon=True).start()
gc.collect()
gc.callbacks.append(after_a_collection)
gc.set_threshold(1)
pulse.frames()
print("returned", gc.isenabled())
"""


def test_the_pulse_reads_the_threads_frames_with_no_collection_inside():
    """A collection that starts inside ``sys._current_frames()`` and frees a ``threading.local``
    deadlocks CPython before 3.11.9 (gh-106883: both of a quick tier's xdist workers waited forever
    on 3.11.7); the pulse's read of the frames returns, and leaves the collector on."""
    ran = subprocess.run([sys.executable, "-c", PULSE_WHILE_A_LOCAL_IS_FREED], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == "returned True", ran.stdout + ran.stderr


def test_the_pulse_beats_while_the_oracle_computes(tmp_path):
    """normcert's oracle between two kernel calls (mpmath over a large case: minutes on a loaded machine)
    is the run advancing: a thread inside the oracle package's code is seen there."""
    stacks = []

    class Seen:
        def __array__(self, dtype=None, copy=None):  # called by numpy from the oracle's own frame
            stacks.append(pulse.in_oracle(sys._getframe()))
            return np.zeros(2)

    fmt(torch.float32).round(Seen())
    assert stacks == [True] and not pulse.in_oracle(sys._getframe())
    (tmp_path / "beat").write_text("")
    assert _touched(tmp_path / "beat", lambda: fmt(torch.float32).round(_Slow()), 2.0)


class _Slow:
    """An array numpy takes 0.5 s to read: the oracle's frame is on the stack meanwhile."""

    def __array__(self, dtype=None, copy=None):
        time.sleep(0.5)
        return np.zeros(2)


def test_an_interpreted_call_that_launches_for_ever_is_hung_all_the_same(session):
    """Progress earns a call time up to PROGRESSING times its limit, not for ever."""
    pytest.importorskip("triton")
    from . import slow_triton  # noqa: PLC0415 - imports triton

    if not interpreter.active():
        pytest.skip("a GPU: no interpreter to count programs in")
    session.kernel_timeout = 0.2
    impl, x, stop = _impl(hostile._rms), torch.randn(1, 8), threading.Event()

    def launches_for_ever():
        while not stop.is_set():
            slow_triton.copy_rows(x)

    sandbox.kernel_code(session, impl, "", lambda: slow_triton.copy_rows(x), F32)  # the first call: compiles
    try:
        with pytest.raises(sandbox.KernelHung, match=f"{PROGRESSING} times its 0.2 s limit, though its interpreted "
                                                     f"launches were still advancing"):
            sandbox.kernel_code(session, impl, "", launches_for_ever, F32)
    finally:
        stop.set()  # the abandoned thread ends


def test_an_error_whose_message_blocks_is_cut_by_the_watchdog(session):
    """The kernel's exception is put into words in the worker thread, under the watchdog: a
    ``__str__`` that never returns is a hang of the kernel's, not of the suite."""
    session.kernel_timeout = 0.2
    with pytest.raises(PropertyFailure, match="rms_error_message_blocks hung: no result after 1 s"):
        _accuracy(session, hostile.rms_error_message_blocks)
    assert session.results[-1].outcome == "fail"


def test_an_output_whose_finalizer_blocks_is_cut_by_the_watchdog(session):
    """The kernel's own output objects are freed in the worker thread (the run keeps aliases of
    them): a finalizer that blocks when an output is freed is a hang of the kernel's, caught even
    under plain pytest, where no parent process watches the run's heartbeat."""
    session.kernel_timeout = 0.2
    with pytest.raises(PropertyFailure, match="rms_output_finalizer_blocks hung: no result after 1 s"):
        _accuracy(session, hostile.rms_output_finalizer_blocks)
    assert session.results[-1].outcome == "fail"


def test_a_slow_first_call_is_not_a_hang(session):
    """torch.compile and Triton compile at a kernel's first call: that call gets FIRST_CALL times
    the timeout, the later ones the timeout."""
    session.kernel_timeout = 0.5
    calls = []

    def rms_compiles_at_first_call(x, weight, eps):
        if not calls:
            time.sleep(1.0)
        calls.append(x.shape)
        return hostile._rms(x, weight, eps)

    assert _accuracy(session, rms_compiles_at_first_call).outcome == "pass"


def test_a_kernel_that_changes_global_state_fails_and_the_state_is_restored(session):
    with pytest.raises(PropertyFailure, match="changed torch's global state: default dtype: torch.float32 -> "
                                              "torch.float64"):
        _accuracy(session, hostile.rms_sets_default_dtype)
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("fn, says", [
    (hostile.rms_turns_deterministic_on, r"deterministic algorithms: \(False, False\) -> \(True, False\)"),
    (hostile.rms_stops_filling_uninitialized_memory, "fill uninitialized memory: True -> False")],
    ids=["deterministic", "fill-uninitialized"])
def test_a_kernel_that_flips_a_global_switch_fails_and_the_switch_is_put_back(session, fn, says):
    """The switches the calling context draws (``search.context``) are the sandbox's to restore."""
    with pytest.raises(PropertyFailure, match=f"changed torch's global state: {says}"):
        _accuracy(session, fn)
    assert not torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory


@pytest.mark.parametrize("fn, says", [(hostile.rms_disables_grad, "grad mode: True -> False"),
                                       (hostile.rms_enters_inference_mode, "inference mode: False -> True"),
                                       (hostile.rms_leaves_five_threads, r"intra-op threads: \d+ -> 5")],
                         ids=["grad-off", "inference-mode", "threads"])
def test_a_kernel_that_leaves_a_thread_mode_on_fails_and_does_not_break_the_next_one(session, fn, says):
    threads = torch.get_num_threads()
    with pytest.raises(PropertyFailure, match=f"left torch's thread-local state changed: .*{says}"):
        _accuracy(session, fn)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled() and torch.get_num_threads() == threads
    good = make("rms_norm", "eager", "plugin", hostile._rms, target="normcert.properties.tests.meta.hostile:_rms")
    assert sandbox.kernel_code(session, good, "", torch.get_num_threads) == threads  # a fresh thread inherits it
    res = runner.run(session, "gradients", good, F32, gradient_cases("rms_norm", F32, "cpu"), check_gradients,
                      max_examples=5)
    assert res.outcome == "pass"


def test_flush_to_zero_inside_a_call_fails_that_kernel_and_not_the_next(session):
    """FTZ is per thread: set in the worker, it is the kernel's failure there (the caller's thread
    never sees it), and the next kernel runs in a fresh thread with subnormals kept: a correct kernel
    after it reads a subnormal input as itself, not as zero."""
    strategy = strategies.cases("rms_norm", F32, "cpu", profiles=("normal",), hostile=False)
    with pytest.raises(PropertyFailure, match="left torch's thread-local state changed: flush denormal: False -> True"):
        runner.run(session, "accuracy", _impl(hostile.rms_flushes_denormals), F32, strategy, check_accuracy,
                   shrink=False)
    good = make("rms_norm", "eager", "plugin", hostile._rms, target="normcert.properties.tests.meta.hostile:_rms")
    assert sandbox.kernel_code(session, good, "", flushes_denormals) is False
    x, w = torch.full((2, 4), 2.0 ** -130), torch.ones(4)  # subnormal in float32; y = x / sqrt(eps): normal
    y = sandbox.kernel_code(session, good, "", lambda: good.fn(x, w, 1e-6))
    assert torch.equal(y, hostile._rms(x, w, 1e-6)) and bool(y.ne(0).all())


def test_flush_to_zero_at_import_is_turned_off_and_fails_every_call_of_the_kernel(session, tmp_path, monkeypatch):
    """A kernel module that calls torch.set_flush_denormal(True) at import would make the oracle read
    subnormals as zero: normcert turns it off again, and the kernel fails, uncalled."""
    (tmp_path / "ftz_at_import.py").write_text("import torch\n\ntorch.set_flush_denormal(True)\n\n\n"
                                               "def rms(x, weight, eps):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ftz_at_import", raising=False)
    impl = impls.plugin("rms_norm=ftz_at_import:rms")
    assert not flushes_denormals()
    assert impl.import_fault == impls.FLUSHED_AT_IMPORT
    with pytest.raises(PropertyFailure, match=r"ftz_at_import:rms: its module set flush-to-zero at import"):
        runner.run(session, "accuracy", impl, F32,
                   strategies.cases("rms_norm", F32, "cpu", profiles=("normal",), hostile=False), check_accuracy,
                   shrink=False)
    assert runner.gradcheck(session, impl).outcome == "fail"
    assert "set flush-to-zero at import" in session.results[-1].message


@pytest.mark.parametrize("fn", [hostile.rms_reused_buffer, hostile.rms_ring_of_two], ids=["static", "ring"])
@pytest.mark.parametrize("check", [check_accuracy, check_determinism], ids=["accuracy", "determinism"])
def test_a_reused_output_buffer_is_a_contract_failure(session, fn, check):
    """One static buffer, or a ring of two: a caller's earlier result would change under it."""
    strategy = strategies.cases("rms_norm", F32, "cpu", profiles=("normal",), hostile=False)
    with pytest.raises(PropertyFailure, match="in the storage of an output of one of its earlier calls"):
        runner.run(session, "accuracy", _impl(fn), F32, strategy, check, max_examples=10)


def test_fresh_outputs_are_not_taken_for_reused_ones(session):
    strategy = strategies.cases("rms_norm", F32, "cpu", profiles=("normal",), hostile=False)
    res = runner.run(session, "determinism", _impl(hostile._rms), F32, strategy, check_determinism, max_examples=20)
    assert res.outcome == "pass"


def _qkv_k(dtype=F32):
    """The k part of a fused (tokens, 3, width) QKV buffer: a view with q and v around it."""
    return torch.randn(3, 3, 8, generator=torch.Generator().manual_seed(0)).to(dtype)[:, 1, :]


def test_an_inplace_kernel_that_writes_around_its_view_is_caught():
    x, w = _qkv_k(), torch.ones(8)
    scribbles = make("rms_norm", "scribbles", "plugin", hostile.rms_inplace_writes_around_its_view,
                     convention="inplace")
    with pytest.raises(ConventionViolation, match="bytes of x's storage outside its view were written"):
        scribbles.fn(x, w, 1e-6)
    honest = make("rms_norm", "honest", "plugin", hostile.rms_inplace, convention="inplace")
    assert torch.equal(honest.fn(x, w, 1e-6), hostile._rms(x, w, 1e-6))


@pytest.mark.parametrize("layout, shape", [("sliced", (3, 40)), ("fused_qkv", (3, 4, 16))])
def test_an_inplace_kernel_that_zeroes_its_span_is_caught_in_the_layouts_normcert_draws(layout, shape):
    """A memset over x's span before y is written into x: the storage around the views the strategies
    make holds POISON (zeros would let it pass), so the zeroed bits around the view are seen."""
    values = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).numpy()
    x, w = strategies.layout_tensor(values, F32, layout, "cpu"), torch.ones(shape[-1])
    assert extent(x) > x.numel()  # storage around the view inside its span
    zeroes = make("rms_norm", "zeroes", "plugin", hostile.rms_inplace_zeroes_span, convention="inplace")
    with pytest.raises(ConventionViolation, match="bytes of x's storage outside its view were written"):
        zeroes.fn(x, w, 1e-6)
    honest = make("rms_norm", "honest", "plugin", hostile.rms_inplace, convention="inplace")
    assert torch.equal(honest.fn(x, w, 1e-6), hostile._rms(x, w, 1e-6))


def test_an_inplace_kernel_is_forward_only_unless_a_backward_is_required(session):
    """copy_ into the caller's buffers records a graph for y and none for residual_out: the calling
    convention is an inference one, so gradients are not certified, not failed."""
    impl = make("add_rms_norm", "by_copy", "plugin", hostile.add_rms_inplace_by_copy, convention="inplace",
                backward=None)
    with pytest.raises(pytest.skip.Exception, match=r"not-certified \(forward only\).*@inplace is an inference"):
        certify(session, BY_NAME["gradients"], impl, F32)
    assert session.results[-1].outcome == "not-certified"
    assert certify(session, BY_NAME["accuracy"], impl, F32).outcome == "pass"


def test_writes_beside_an_inputs_view_are_seen(session):
    with pytest.raises(PropertyFailure, match="mutated its input 'x'"):
        _accuracy(session, hostile.rms_writes_beside_its_view)


def test_an_output_in_an_inputs_storage_is_a_contract_failure(session):
    with pytest.raises(PropertyFailure, match="returned y in the storage of its input 'x'"):
        _accuracy(session, hostile.rms_returns_input_view)


def test_gradcheck_gives_a_compiled_backward_a_fresh_graph_per_call():
    # torch.autograd.gradcheck reuses one graph (retain_graph=True); a freshly compiled
    # backward with donated buffers refuses that, so a correct kernel failed or passed by test order
    fresh = torch.compile(lambda x, w: hostile._rms(x, w, 1e-5), dynamic=True)
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 6, generator=gen, dtype=torch.float64), torch.randn(6, generator=gen, dtype=torch.float64)
    assert finite_differences(fresh, [x, w]) is None


class _ZeroBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        return hostile._rms(x, weight, 1e-5)

    @staticmethod
    def backward(ctx, g):
        return torch.zeros_like(g), None


@pytest.mark.parametrize("fn, says", [
    (lambda x, w: hostile._rms(x.float(), w.float(), 1e-5).double(),
     "the finite differences are off and the backward is right -- the forward moves in steps coarser than float64"),
    (_ZeroBackward.apply, "the backward off by more than gradcheck's tolerance of the exact value"),
], ids=["computes-in-float32", "zero-backward"])
def test_gradcheck_says_which_side_is_off(fn, says):
    """A kernel that takes float64 and computes in float32 has a right backward and noisy finite
    differences; a zero backward is the backward's fault.  The oracle's exact derivative decides."""
    case = gradcheck_case("rms_norm", "cpu")
    names = list(case.record.grads_in(case.tensors))
    mismatch = finite_differences(fn, [case.tensors[k] for k in names])
    said = which_side(case, names, mismatch)
    assert says in said and ", exact " in said, said


def test_gradcheck_rejects_a_backward_that_is_not_the_derivative():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return 3 * g  # d(x^2)/dx is 2x

    x = torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(2, 3)
    assert "backward gives 3.0, finite differences" in str(finite_differences(Square.apply, [x]))


def test_gradcheck_of_no_output_elements_stays_on_the_leaves_device():
    """A kernel whose outputs hold no element has an empty Jacobian on its inputs' device: the
    empty analytic one was made on the CPU, and subtracting the numerical one (on a GPU) raised
    a device mismatch in normcert's own code.  The meta device stands for a device other than the CPU."""
    x = torch.zeros(2, 3, dtype=torch.float64, device="meta")
    assert finite_differences(lambda t: t[:0], [x]) is None


def test_a_finished_call_leaves_no_reference_to_its_inputs(session):
    """The watchdog's thread drops each call once it returns: a case's tensors are freed when the
    suite drops them (on a GPU, --profile large's cases would otherwise fill the device)."""
    x = torch.ones(4)
    alive = weakref.ref(x)
    assert sandbox.kernel_code(session, _impl(hostile._rms), "", functools.partial(torch.sum, x)).item() == 4
    del x
    gc.collect()
    assert alive() is None


def _wrong_when_compiled(x, weight, eps):
    """Right in eager mode, 2 y once compiled (``torch.compiler.is_compiling``)."""
    y = hostile._rms(x, weight, eps)
    return y * 2 if torch.compiler.is_compiling() else y


def test_a_compiled_kernel_runs_compiled_on_every_case(session):
    """Past Dynamo's default recompile_limit (8) a compiled function silently runs its eager code;
    a kernel compiled per shape (dynamic=False), wrong only when compiled, would then be certified
    on the cases after its 8th shape.  In normcert's kernel thread every call runs compiled code."""
    compiled = torch.compile(_wrong_when_compiled, dynamic=False)
    impl = make("rms_norm", "wrong_when_compiled", "plugin", compiled,
                target="normcert.properties.tests.meta.test_hostile:_wrong_when_compiled")
    w = torch.ones(4)
    for rows in range(1, 12):
        x = torch.randn(rows, 4)
        got, eager = sandbox.kernel_code(session, impl, "", lambda: compiled(x, w, 1e-5)), hostile._rms(x, w, 1e-5)
        # the compiled answer (2 y; inductor's y may differ from eager's in its last bits), not the eager one
        assert torch.all((got - 2 * eager).abs() < (got - eager).abs()), rows


def test_a_kernel_past_the_recompile_limit_fails_saying_why(session, monkeypatch):
    monkeypatch.setattr(sandbox, "RECOMPILE_LIMIT", 3)
    compiled = torch.compile(lambda x: x + 1, dynamic=False)
    impl = make("rms_norm", "recompiles", "plugin", compiled, target="normcert.properties.tests.meta.test_hostile:_impl")
    with pytest.raises(sandbox.ContractViolation, match="torch.compile recompiled it 3 times, normcert's limit; "
                                                        "past it Dynamo would run its eager code"):
        for rows in range(1, 8):
            sandbox.kernel_code(session, impl, "", lambda: compiled(torch.zeros(rows, 2)))
