"""Liger-Kernel 0.8.5 as users import it (``examples/real_kernels/liger.py``): a selection of its
adapters judged by their declarations, each verdict and cause asserted, at narrow scopes (one family,
one dtype, a few drawn examples) so that the Triton interpreter's cost stays within the heavy tier's
budget.  The real defects asserted: in_place=True's backward writing over dy (certified declared
``dy=overwritten``), SwiGLU's backward writing over gate and up, the fused gate-up SiLU-mul's backward
flattening its gradient, GeGLU's float16 backward overflow, float64 computed in float32.  The full
gallery's verdicts and times are in ``docs/explanation/findings.md``.

Heavy tier; skipped where liger-kernel is not installed (it is no dependency of normcert:
``pip install --no-deps liger-kernel==0.8.5``)."""
from __future__ import annotations

import pathlib

import pytest
import torch

from ....impls import plugin
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner

pytest.importorskip("liger_kernel", reason="liger-kernel is not installed: pip install --no-deps liger-kernel==0.8.5")

EXAMPLES = pathlib.Path(__file__).parents[3] / "examples" / "real_kernels"
F32, F16 = torch.float32, torch.float16


@pytest.fixture
def session(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return Session(failures_dir=str(tmp_path))


def _rejects(session, spec, family, dtype, match, max_examples=2):
    with pytest.raises(PropertyFailure, match=match):
        runner.run_family(session, BY_NAME[family], plugin(spec), dtype, max_examples=max_examples, shrink=False)


@pytest.mark.normcert_heavy
def test_liger_in_place_rms_norm_is_certified_declared_and_rejected_undeclared(session):
    """LigerRMSNorm's default in_place=True writes dx over dy: rejected naming it, certified under
    dy=overwritten (the module instance, as users build it, carries the declaration)."""
    _rejects(session, "rms_norm=liger:rms_norm_in_place_undeclared", "gradients", F32,
             r"its backward wrote into the incoming gradient of 'y'")
    impl = plugin("rms_norm=liger:rms_norm_module")
    assert "dy=overwritten" in impl.domain.describe()
    res = runner.run_family(session, BY_NAME["gradients"], impl, F32, max_examples=2)
    assert res.outcome == "pass", res.message


@pytest.mark.normcert_heavy
def test_liger_swiglu_backward_writing_over_its_inputs_is_named(session):
    """Liger's SwiGLU backward writes dgate and dup over the caller's gate and up: named as such."""
    _rejects(session, "swiglu=liger:swiglu", "gradients", F32, r"its backward wrote into its input 'gate' and 'up'")


@pytest.mark.normcert_heavy
def test_liger_fused_gate_up_backward_fails_on_rank_3(session):
    """Its backward returns the gradient flattened to (-1, 2H), which autograd refuses for x of rank 3."""
    _rejects(session, "silu_and_mul=liger:silu_and_mul", "gradients", F32,
             r"LigerFusedGateUpSiLUMulFunctionBackward returned an invalid gradient")


@pytest.mark.normcert_heavy
def test_liger_geglu_float16_backward_overflow_is_rejected(session):
    """dy * up rounded to float16 before gelu'(gate): -inf where the exact dgate is finite, NaN (inf * 0)
    where gelu' is 0, found by the gradients family's loud bucket (declared approximate=tanh)."""
    _rejects(session, "geglu=liger:geglu_cloned", "gradients", F16, r"dgate\[[\d, ]+\]: got (-?inf|nan)")


@pytest.mark.normcert_heavy
def test_liger_float64_is_computed_in_float32(session):
    """Undeclared, float64 is rejected (a float32 result in a float64 tensor); the gallery's adapters
    declare no float64."""
    _rejects(session, "rms_norm=liger:rms_norm_all_dtypes", "accuracy", torch.float64, r"ulp of float64")
    assert plugin("rms_norm=liger:rms_norm_llama").domain.describe().count("float64") == 0
