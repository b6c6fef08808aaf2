"""The ``cuda graph`` mode (``families.graphed``) on CPU: the steps around the recording (warm-up,
capture, -x written into the static input, replay, the check, x put back; a failed capture
noted, or failed where ``capturable=yes`` is declared) run with ``Rerun``, a stand-in for
``CudaGraph`` whose replay calls the kernel again and whose capture refuses a host sync as CUDA's
does.  A real graph replays only the captured device work, so a kernel that is stale under
``Rerun`` is stale under a graph too; the GPU workflow runs the real one (``--device cuda``).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ....impls import make
from ...search.case import Case
from ...families.graphed import graphed
from ...families.served import modes_ran
from ...harness.measure import PropertyFailure, Worst
from ...harness.session import Session

from . import planted_modes

F32 = torch.float32


class _NoHostSync(TorchDispatchMode):
    """A capture's rule: reading a device value back to the host (``.item()``) raises."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            raise RuntimeError("operation not permitted when stream is capturing")
        return func(*args, **(kwargs or {}))


class Rerun:
    """capture(fn): fn's outputs, kept; replay(): fn called again, its outputs copied into the kept ones."""

    @staticmethod
    def warm(fn):
        fn()

    def capture(self, fn):
        self.fn = fn
        with _NoHostSync():
            self.outs = fn()
        return self.outs

    def replay(self):
        new = self.fn()
        kept = self.outs if isinstance(self.outs, tuple) else (self.outs,)
        for k, o in zip(kept, new if isinstance(new, tuple) else (new,)):
            k.copy_(o)


def _impl(fn, domain=None):
    return make("rms_norm", fn.__name__, "plugin", fn, domain=domain,
                target=f"normcert.properties.tests.meta.planted_modes:{fn.__name__}")


def _case():
    g = torch.Generator().manual_seed(0)
    return Case("rms_norm", {"x": torch.randn(3, 40, generator=g), "weight": torch.rand(40, generator=g) + 0.5},
                {"eps": 1e-6})


def test_a_capturable_correct_kernel_replays_to_the_oracle_of_the_new_values_and_x_is_put_back(tmp_path):
    session, case = Session(failures_dir=str(tmp_path)), _case()
    x = case.main.clone()
    graphed(session, _impl(planted_modes.rms_served_twin), case, Worst(), None, graph=Rerun)
    assert torch.equal(case.main, x) and not session.uncapturable


def test_a_kernel_whose_replay_returns_the_captured_values_fails():
    session, case = Session(), _case()
    with pytest.raises(PropertyFailure):
        graphed(session, _impl(planted_modes.rms_cached_by_address), case, Worst(), None, graph=Rerun)


def test_a_failed_capture_is_noted_by_default_failed_under_capturable_yes_and_not_tried_under_no():
    impl = _impl(planted_modes.rms_host_sync)
    session = Session(device="cuda")
    graphed(session, impl, _case(), Worst(), None, graph=Rerun)
    assert "operation not permitted when stream is capturing" in session.uncapturable[impl.id]
    assert "cuda graph: not capturable: " in modes_ran(session, impl, F32) and not session.uncapturable

    with pytest.raises(PropertyFailure, match="not capturable, though its domain declares capturable=yes"):
        graphed(Session(), _impl(planted_modes.rms_host_sync, "capturable=yes"), _case(), Worst(), None, graph=Rerun)

    never = _impl(planted_modes.rms_host_sync, "capturable=no")
    graphed(session, never, _case(), Worst(), None, graph=lambda: pytest.fail("captured under capturable=no"))
    assert "not run: " in modes_ran(session, never, F32) and "cuda graph (its domain declares capturable=no)" in \
        modes_ran(session, never, F32)


def test_on_cpu_the_mode_says_it_needs_a_gpu():
    assert "cuda graph (needs a GPU)" in modes_ran(Session(device="cpu"), _impl(planted_modes.rms_served_twin), F32)
