"""The compiled family (``families.compiled``) has teeth: a torch operator with a wrong fake
implementation and a kernel whose traced path differs are rejected on every one of
``--normcert-meta-seeds`` seeds, with the check's own words, and the registry's torch-operator
RMSNorm is certified; only a torch operator, or a kernel given ``--compile``, is checked so.
"""
from __future__ import annotations


import pytest
import torch

from ....impls import custom_op, make
from ...run import runner
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.sandbox import ContractViolation
from ...harness.session import Session

from . import planted_compiled

COMPILED = BY_NAME["compiled"]


def _impl(fn, **kw):
    name = getattr(fn, "__name__", None) or fn._name.split("::")[-1]
    return make("rms_norm", name, "plugin", fn, target=f"normcert.properties.tests.meta.planted_compiled:{name}", **kw)


def _seeds(session, request):
    for k in range(request.config.getoption("--normcert-meta-seeds")):
        yield Session(device=session.device, seed=session.seed + k, failures_dir=session.failures_dir,
                      eager=session.eager)


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   eager=normcert_session.eager)


def test_only_an_operator_or_compile_is_checked_compiled():
    assert _impl(planted_compiled.rms_fake_says_float32).compiles
    assert not _impl(planted_compiled.rms_compiled_drops_eps).compiles
    assert custom_op.IMPLS[0].compiles and COMPILED.covers(custom_op.IMPLS[0], bitwise=False)
    assert not COMPILED.covers(_impl(planted_compiled.rms_compiled_drops_eps), bitwise=False)


def test_a_wrong_fake_implementation_is_killed_on_every_seed(session, request):
    impl = _impl(planted_compiled.rms_fake_says_float32, domain="weightless=no")
    for mine in _seeds(session, request):
        with pytest.raises((PropertyFailure, ContractViolation), match="torch.library.opcheck of normcert_planted::"):
            runner.run_family(mine, COMPILED, impl, torch.bfloat16, shrink=False)
        assert mine.results[-1].outcome == "fail"


def test_a_compiled_path_that_drops_eps_is_killed_on_every_seed(session, request):
    impl = _impl(planted_compiled.rms_compiled_drops_eps, compiles=True)  # as --compile makes it
    for mine in _seeds(session, request):
        with pytest.raises(PropertyFailure, match=r"called under torch.compile\(fullgraph=True\)"):
            runner.run_family(mine, COMPILED, impl, torch.float32, shrink=False)
        assert mine.results[-1].outcome == "fail"


def test_the_registry_operator_is_certified(session):
    impl = custom_op.IMPLS[0]
    for dtype in (torch.float32, torch.bfloat16):
        assert runner.run_family(session, COMPILED, impl, dtype).outcome == "pass"
    assert session.results[-1].modes.startswith("modes: eager with torch.library.opcheck")
