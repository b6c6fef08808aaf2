"""``approximate=`` in a declared domain: the GELU forms a GeGLU kernel computes (Liger's: tanh only).

A tanh-only kernel that refuses the erf form is rejected without the declaration, its message
naming the sample's form; with ``approximate=tanh`` its cases are fitted to the tanh form and it is
certified, the domain saying so; the key on an op without a GELU is refused when the kernel is
registered.
"""
from __future__ import annotations

import pytest
import torch

from ....impls import UsageError, make
from ...declared.domain import parse
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner
from ...search.case import Case
from ...search.fitting import fit
from .planted import activations


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path))


def _impl(domain=None):
    fn = activations.geglu_tanh_only
    return make("geglu", fn.__name__, "plugin", fn, target=f"{fn.__module__}:{fn.__name__}", backward=None,
                **({"domain": domain} if domain else {}))


def test_a_tanh_only_kernel_is_rejected_without_the_declaration_naming_the_form(session):
    with pytest.raises(PropertyFailure, match=r"refused the op's sample \(2 rows, approximate='none'\)"):
        runner.run_family(session, BY_NAME["accuracy"], _impl("dtypes=float32"), torch.float32)


@pytest.mark.parametrize("family", ["accuracy", "extremes", "gradients"])
def test_a_tanh_only_kernel_is_certified_under_approximate_tanh(session, family):
    res = runner.run_family(session, BY_NAME[family], _impl("approximate=tanh"), torch.float32)
    assert res.outcome == "pass", res.message
    assert "GELU forms tanh" in _impl("approximate=tanh").domain.describe()


def test_cases_are_fitted_to_a_declared_form():
    domain = parse("approximate=tanh")
    case = fit(Case.sample("geglu", torch.float32, rows=2, width=4), domain)
    assert case.scalars["approximate"] == "tanh" and "approximate -> tanh" in case.notes.get("fitted", "")
    with pytest.raises(UsageError, match="approximate=tanh: rms_norm takes no such argument value"):
        make("rms_norm", "k", "plugin", lambda x, weight, eps: x, target="m:k", domain="approximate=tanh")
