"""The calling modes (``modes``, ``families.served``) have teeth: each planted mode bug
(``planted_modes``) is rejected on every one of ``--normcert-meta-seeds`` seeds, naming its mode,
and the correct twin that takes every fast path is certified; each result says how it was called.
"""
from __future__ import annotations

import pytest
import torch

from ....impls import make
from ...run import runner
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...search.modes import threads_n

from . import planted_modes

F32 = torch.float32
SAYS = {"rms_no_grad_drops_eps": "called under no_grad", "rms_autocast_bf16_stats": "called under autocast",
        "rms_cached_by_address": "called under reused buffer", "rms_wrong_multithreaded": r"called under inference_mode \+ threads=\d",
        "rms_first_call_zeros": "its first call in float32 in this process",
        "rms_autocast_backward_bf16": "called under autocast: dx"}


def _impl(fn):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted_modes:{fn.__name__}")


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   eager=normcert_session.eager, long_run=normcert_session.long_run,
                   long_run_every=normcert_session.long_run_every)


@pytest.mark.parametrize("fn", list(planted_modes.BUGS), ids=[f.__name__ for f in planted_modes.BUGS])
def test_a_mode_bug_is_killed_on_every_seed(fn, session, request):
    family = BY_NAME[planted_modes.BUGS[fn]]
    base = session.seed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as an xdist worker runs: only the served family's threads=N mode has more
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    for k in range(request.config.getoption("--normcert-meta-seeds")):
        getattr(fn, "forget", lambda: None)()
        mine = Session(device=session.device, seed=base + k, failures_dir=session.failures_dir, eager=session.eager,
                       long_run=session.long_run, long_run_every=session.long_run_every)
        with pytest.raises(PropertyFailure, match=SAYS[fn.__name__]):
            runner.run_family(mine, family, _impl(fn), F32, shrink=False)
        assert mine.results[-1].outcome == "fail"


def test_a_served_failure_under_a_thread_mode_records_that_mode_s_threads(session, request):
    """The multithreaded bug fails under "inference_mode + threads=N": its row says threads N, not the
    1 thread the run (an xdist worker) has outside that call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    with pytest.raises(PropertyFailure, match=r"called under inference_mode \+ threads=\d"):
        runner.run_family(session, BY_NAME["served"], _impl(planted_modes.rms_wrong_multithreaded), F32, shrink=False)
    result = session.results[-1]
    assert result.outcome == "fail" and result.threads == threads_n() > 1
    assert result.failures[0]["worst_units"] > 1  # the mode's failure keeps its measurement


def test_the_twin_that_takes_every_fast_path_is_certified(session):
    impl = _impl(planted_modes.rms_served_twin)
    for dtype in (torch.float32, torch.bfloat16):
        for family in ("served", "accuracy"):
            assert runner.run_family(session, BY_NAME[family], impl, dtype).outcome == "pass"
    served, accuracy = session.results[-2], session.results[-1]
    assert served.modes.startswith("modes: no_grad, inference_mode, ") and "reused buffer" in served.modes
    assert "autocast" not in served.modes.split("; not run")[0]  # bfloat16: autocast is float32's
    assert accuracy.modes.startswith("contexts: grad on ") and accuracy.threads == torch.get_num_threads()
