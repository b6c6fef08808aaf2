"""pytest glue: a property family's run as a pytest test, its ``Result`` mapped to pytest's outcome.

pass passes; fail fails with the run's message (the shrunk case and the replay
command, not the suite's frames), once (``failed``); a case study's failure is an expected failure
(xfail); not-supported, not-certified and a kernel registered without a backward
skip, saying why; a bitwise family's failure without --bitwise is a ``warn`` row, which passes
the test: the plugin's terminal summary says it (``plugin.Suite.pytest_terminal_summary``), never
Python's warning filters, which ``-W error``, ``PYTHONWARNINGS=error`` or a ``filterwarnings =
error`` ini would turn into the kernel's failure.  A failure's captured log leaves torch's
structured-trace records out (``without_torch_trace``).
"""
from __future__ import annotations

import traceback

import pytest
import torch

from ...oracle.formats import DTYPE_NAMES

from ..families.large import need_bytes, one_at_a_time
from ..harness.measure import PropertyFailure
from ..harness.probes import inference_convention
from .runner import NO_GRAD_FN, Result, forward_only, gradcheck, outside_domain, record, run_family, scheduled


def certify(session, family, impl, dtype, *, judge=None) -> Result:
    """``run`` of a property family (``families.Family``) as a pytest test: not-supported
    skips, a case study's failure is expected, a bitwise family gates only under --bitwise.
    ``judge``: how the run's outcome is read (``runner.run``), by default ``expected(impl)``."""
    if family.backward:
        backward_gate(session, family, impl, dtype)
    gating = session.bitwise if family.bitwise else True
    try:
        res = run_family(session, family, impl, dtype, gating=gating, judge=judge or expected(impl))
    except PropertyFailure as e:
        if impl.expected_failure:
            raise pytest.xfail.Exception(f"{impl.expected_failure} | {e}") from None
        raise failed(str(e)) from None
    if res.outcome == "not-supported":
        pytest.skip(f"not-supported: {impl.id} {res.message}")
    if res.outcome == "not-certified":
        pytest.skip(f"not-certified: {impl.id} in {res.dtype}: {res.message}")
    return res


def failed(message: str) -> BaseException:
    """pytest's failure of a test, said as ``message`` alone: the message is the report (the shrunk
    case, its context, the replay command), the suite's frames are noise.  Raised ``from None`` where
    it replaces the ``PropertyFailure`` being handled: pytest prints an exception's context as well,
    after "During handling of the above exception, another exception occurred", which printed every
    failure twice."""
    return pytest.fail.Exception(message, pytrace=False)


def expected(impl):
    """The judge of a run as a test: a case study's failure (or error) is its expected verdict."""
    def judge(outcome: str, message: str) -> tuple[str, str]:
        return ("expected-fail" if impl.expected_failure and outcome in ("fail", "error") else outcome), message
    return judge


def backward_gate(session, family, impl, dtype) -> None:
    """Before a family that checks the backward: a kernel registered without one skips; a
    forward-only kernel (``runner.forward_only``) is not certified by the family (a skip), or
    fails it where it was registered with a backward or under --require-backward."""
    if impl.backward is False:
        pytest.skip(f"{impl.id} is registered without backward")
    try:
        res = forward_only(session, family, impl, dtype)
    except PropertyFailure as e:
        raise failed(str(e)) from None
    if res is None:
        return
    if res.outcome == "fail":
        pytest.fail(f"{family.name} fails for {impl.id} in {res.dtype}: {res.message}", pytrace=False)
    if res.outcome == "not-supported":
        pytest.skip(f"not-supported: {impl.id} {res.message}")
    reason = inference_convention(session, impl) or NO_GRAD_FN
    pytest.skip(f"not-certified (forward only): {impl.id}: {reason}; --require-backward makes this a failure")


def certify_gradcheck(session, family, impl) -> None:
    """gradcheck's test in float64 (``runner.gradcheck``; skipped where float64 is not supported)."""
    outside = outside_domain(session, impl, family.name, torch.float64)
    if outside:
        pytest.skip(f"not-supported: {impl.id} {outside.message}")
    backward_gate(session, family, impl, torch.float64)
    res = gradcheck(session, impl)
    if res.outcome == "not-supported":
        pytest.skip(f"{impl.id} does not support float64")
    if res.outcome == "expected-fail":
        pytest.xfail(f"{impl.expected_failure} | {res.message}")
    if res.outcome != "pass":
        pytest.fail(res.message, pytrace=False)


def certify_large(session, family, impl, dtype) -> None:
    """The large family (``families.large``) as a pytest test: opt-in (``--profile large``) and on a
    GPU; a dtype whose cases do not fit the device's free memory, or that runs out of it, is not
    certified by the family, and says so."""
    if session.profile != family.profile:
        pytest.skip(f"opt-in: --profile {family.profile} (cases past 2**31 elements, on a GPU)")
    if session.device != "cuda":
        pytest.skip(f"--profile {family.profile}: the cases hold more than 2**31 elements, for a GPU "
                    f"(--device cuda); not run on {session.device}")
    with one_at_a_time():
        free = torch.cuda.mem_get_info()[0]
        need = max(need_bytes(impl.op, dtype, b) for b in scheduled(session, family, impl, dtype))
        if need > free:
            res = record(session, impl, family.name, DTYPE_NAMES[dtype], "not-certified",
                         message=f"its cases need {need / 2 ** 30:.1f} GiB of device memory, "
                                 f"{free / 2 ** 30:.1f} GiB free")
            pytest.skip(f"not-certified: {impl.id} in {res.dtype}: {res.message}")
        as_test = expected(impl)

        def judge(outcome: str, message: str) -> tuple[str, str]:
            if outcome in ("fail", "error") and "CUDA out of memory" in message:
                return "not-certified", f"out of device memory ({message})"
            return as_test(outcome, message)

        try:
            certify(session, family, impl, dtype, judge=judge)
        except (pytest.fail.Exception, pytest.xfail.Exception) as e:
            _drop_frames(e)
            raise


def _drop_frames(e: BaseException | None) -> None:
    """Clear the locals of the finished frames behind ``e`` and the exceptions it chains: they hold
    the failed case, whose device memory pytest would keep (it keeps the last failure's traceback)."""
    while e is not None:
        traceback.clear_frames(e.__traceback__)
        e = e.__context__ or e.__cause__


def without_torch_trace(config) -> None:
    """torch's structured-trace records (logger ``torch.__trace``: payloads for tlparse, empty as
    text) kept out of pytest's captured logs.  torch 2.11 lets them reach the root logger: on an
    H200, each failure of a compiled kernel carried thousands of empty DEBUG lines."""
    logs = config.pluginmanager.get_plugin("logging-plugin")
    for handler in (logs.caplog_handler, logs.report_handler) if logs else ():
        handler.addFilter(lambda record: record.name != "torch.__trace")
