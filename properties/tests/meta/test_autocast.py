"""``autocast=casts``, a declared contract choice of the call (issue 53, item 6): inside autocast a
kernel following apex's and timm's convention (``planted_autocast``: inputs cast to bfloat16,
float32 statistics, y in bfloat16) is held to the oracle of its inputs cast to bfloat16.

* without the declaration, its bfloat16 y inside autocast breaks the contract ("returned y of dtype
  torch.bfloat16, expected torch.float32"), as before;
* with it, accuracy (autocast drawn in the context), gradients (the VJP of the cast inputs) and
  served (its autocast mode) pass in float32, and its other dtypes as any kernel's;
* a kernel declaring it but wrong inside autocast (its partial sums added in bfloat16) is rejected
  in context autocast=on;
* the key is read, said back, described, and refused on an op without a backward.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from ....impls import UsageError, make
from ...declared.domain import Domain, DomainError, parse
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.sandbox import ContractViolation
from ...harness.session import Session
from ...run import runner

from . import planted_autocast

F32 = torch.float32


def _impl(fn):
    return make("rms_norm", fn.__name__, "plugin", fn,
                target=f"normcert.properties.tests.meta.planted_autocast:{fn.__name__}")


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path))


def test_the_key_is_read_said_back_and_refused_without_a_backward():
    domain = parse("autocast=casts")
    assert domain.autocast == "casts" and domain.spec() == "autocast=casts" and domain.declared
    assert domain.describe().startswith("autocast=casts (inside autocast: outputs in bfloat16")
    assert parse({"autocast": "keeps"}).describe() == "autocast=keeps"
    with pytest.raises(DomainError, match=r"--domain: autocast='bf16': expected one of keeps, casts"):
        parse("autocast=bf16")
    with pytest.raises(UsageError, match=r"autocast=casts: rms_norm_fp8 has no backward"):
        make("rms_norm_fp8", "k", "plugin", planted_autocast.rms_apex_autocast, domain="autocast=casts")


def test_undeclared_the_apex_convention_breaks_the_contract(session):
    impl = dataclasses.replace(_impl(planted_autocast.rms_apex_autocast), domain=Domain())
    with pytest.raises(PropertyFailure, match=r"in context [^:]*autocast=on[^:]*: .*returned y of dtype "
                                              r"torch\.bfloat16, expected torch\.float32\n"):
        runner.run_family(session, BY_NAME["accuracy"], impl, F32, shrink=False)


@pytest.mark.parametrize("family", ["accuracy", "gradients", "served"])
def test_declared_the_apex_convention_is_certified(family, session):
    impl = _impl(planted_autocast.rms_apex_autocast)
    res = runner.run_family(session, BY_NAME[family], impl, F32)
    assert res.outcome == "pass", res.message
    if family != "served":
        assert re.search(r"autocast off \d+, on [1-9]", res.modes), res.modes  # the drawn contexts met autocast
    else:
        assert "autocast" in res.modes.split(";")[0], res.modes


def test_declared_but_wrong_inside_autocast_is_rejected(session):
    impl = _impl(planted_autocast.rms_apex_autocast_bf16_sums)
    with pytest.raises(PropertyFailure, match=r"accuracy fails .* in context [^:]*autocast=on[^:]*: y\["):
        runner.run_family(session, BY_NAME["accuracy"], impl, F32, shrink=False)


def test_outputs_half_cast_are_a_contract_violation(session):
    """All of the outputs in the autocast dtype, or none: one case holds them."""
    def half_cast(x, residual, weight, eps):
        x, residual, weight = planted_autocast._cast_if_autocast_enabled(x, residual, weight)
        with torch.autocast(x.device.type, enabled=False):
            s = x + residual
            y = planted_autocast.rms_apex_autocast(s, weight, eps)
        return y, s.float()
    half_cast.normcert_domain = "autocast=casts"
    impl = make("add_rms_norm", "half_cast", "plugin", half_cast, target="here:half_cast")
    with pytest.raises((PropertyFailure, ContractViolation), match=r"some outputs in torch\.bfloat16 and others"):
        runner.run_family(session, BY_NAME["accuracy"], impl, F32, shrink=False)
