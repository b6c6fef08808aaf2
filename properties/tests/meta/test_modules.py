"""Modules as kernels (``properties.declared.modules``): ``OP=MODULE:ATTR`` naming an ``nn.Module``
class or instance is certified as the op's function of it, its weight (and bias) the case's, its
eps the case's; a module that drops the eps it is given is rejected and its twin certified; one
normcert cannot call so is refused at registration in one line."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from .... import impls
from ...declared.domain import parse
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner

PLANTED = "normcert.properties.tests.meta.planted_modules"


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path))


@pytest.mark.parametrize("spec, in_dtype, domain", [
    ("rms_norm=torch.nn:RMSNorm", torch.float64, None),
    ("layer_norm=torch.nn:LayerNorm", torch.float64, "params=same"),  # torch's CPU layer_norm: one dtype
    (f"rms_norm={PLANTED}:LlamaLikeRMSNorm", torch.float32, None),
    (f"rms_norm={PLANTED}:llama_instance", torch.float32, None),
])
def test_a_module_is_certified_as_the_op_s_function_of_it(session, spec, in_dtype, domain):
    impl = impls.plugin(spec)
    impl = replace(impl, domain=parse(domain)) if domain else impl
    for family in ("accuracy", "gradients"):
        res = runner.run_family(session, BY_NAME[family], impl, in_dtype, max_examples=10)
        assert res.outcome == "pass", (spec, family, res.message)


def test_a_module_s_own_domain_is_read():
    assert impls.plugin(f"rms_norm={PLANTED}:LlamaLikeRMSNorm").domain.dtypes == ("float32", "float16", "bfloat16")


def test_a_module_that_drops_the_eps_it_is_given_is_rejected_and_its_twin_certified(session):
    with pytest.raises(PropertyFailure, match="extremes fails"):
        runner.run_family(session, BY_NAME["extremes"], impls.plugin(f"rms_norm={PLANTED}:RMSNormFixedEps"),
                          torch.float64)
    twin = impls.plugin(f"rms_norm={PLANTED}:RMSNormExact")
    assert runner.run_family(session, BY_NAME["extremes"], twin, torch.float64).outcome == "pass"


@pytest.mark.parametrize("spec, says", [
    (f"rms_norm={PLANTED}:NoWeight", "holds no parameter 'weight' (its parameters: none)"),
    (f"rms_norm={PLANTED}:no_eps_instance", "holds no epsilon normcert can set"),
    ("swiglu=torch.nn:RMSNorm", "a module can stand for rms_norm, gemma_rms_norm, layer_norm"),
    ("layer_norm=torch.nn:RMSNorm", "holds no parameter 'bias'"),
])
def test_a_module_normcert_cannot_call_is_refused_in_one_line(spec, says):
    with pytest.raises(impls.UsageError, match=re.escape(says)) as e:
        impls.plugin(spec)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"--impl {spec!r}")
