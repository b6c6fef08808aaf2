"""Every op's replay file replays (issue 47): for each op record, a planted bug's failing case saved
as the runner saves it, then in a fresh process outside the clone ``normcert replay FILE`` exits 1
(the property still fails) and ``normcert replay FILE --impl OP=normcert.impls.eager:OP`` exits 0
(the registry's eager kernel, correct, on the same bits).  The FP4 ops and a grouped rms_norm_gated
are among them: their files' scalars are checked against the row length, which ``normcert replay``
once read before any tensor was built (an INTERNALERROR, exit 3).  Heavy: two processes per op.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import torch

from ... import oracle
from ...impls import plugin
from ..evidence.replay import save_failure
from ..search.case import Case

BUGS = {
    "rms_norm": "rms_eps_outside_sqrt", "gemma_rms_norm": "gemma_offset_forgotten",
    "add_rms_norm": "add_rms_stale_residual", "rms_norm_gated": "gated_silu_of_x",
    "rms_norm_fp8": "fp8_scale_multiplied", "add_rms_norm_fp8": "add_fp8_normalises_x",
    "rms_norm_dynamic_quant": "dq_scale_from_x", "add_rms_norm_dynamic_quant": "add_dq_scale_before_add",
    "rms_norm_group_quant": "gq_scale_per_row", "add_rms_norm_group_quant": "add_gq_scale_before_add",
    "rms_norm_fp4_quant": "fp4_nibbles_swapped", "add_rms_norm_fp4_quant": "add_fp4_scale_before_add",
    "layer_norm": "ln_unbiased", "add_layer_norm": "add_ln_mean_of_x_alone", "batch_norm": "bn_counts_padding",
    "deep_norm": "deep_beta_input", "swiglu": "swiglu_sigmoid_by_tanh", "silu_and_mul": "silu_and_mul_swapped",
    "silu_and_mul_dynamic_quant": "sdq_product_in_bf16", "silu_and_mul_group_quant": "sgq_gate_up_interleaved",
    "silu_and_mul_group_quant_masked": "sgqm_scale_over_expert", "silu_and_mul_fp4_quant": "silu_fp4_scale_of_gate",
    "geglu": "geglu_tanh_always", "gelu_and_mul": "gelu_and_mul_swapped",
}
"""A planted bug of each op that fails accuracy on the op's sample case (``_case``)."""


def _case(op: str) -> Case:
    """The op's sample (3 rows of 256, float32), made to show its bug: a large eps for rms_norm's eps
    outside the root, a padded row for batch_norm, a very negative gate for swiglu's tanh form of the
    sigmoid, four groups for rms_norm_gated (its file's group_size is checked against the row)."""
    case = Case.sample(op, torch.float32, rows=3, width=256)
    if op == "rms_norm":
        case.scalars["eps"] = 0.5
    elif op == "batch_norm":
        case.tensors["mask"] = torch.tensor([False, True, True])
    elif op == "swiglu":
        case.tensors["gate"] = torch.full_like(case.tensors["gate"], -20.0)
    elif op == "rms_norm_gated":
        case.scalars["group_size"] = 64
    return case


def _run(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(cwd / ".hypothesis-storage")
    return subprocess.run([sys.executable, "-m", "normcert", "replay", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_every_op_has_a_bug_to_replay():
    assert sorted(BUGS) == sorted(oracle.OPS)


@pytest.mark.normcert_heavy  # two fresh processes per op
@pytest.mark.parametrize("op", sorted(BUGS))
def test_every_op_s_replay_file_fails_again_and_passes_a_fixed_kernel(tmp_path, op):
    impl = plugin(f"{op}=normcert.properties.tests.meta.planted:{BUGS[op]}")
    path = shlex.split(save_failure(impl, "accuracy", _case(op), directory=str(tmp_path / "saved")))[-1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bad = _run(path, cwd=elsewhere)
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert f"accuracy still fails for {op}:normcert.properties.tests.meta.planted" in bad.stdout
    good = _run(path, "--impl", f"{op}=normcert.impls.eager:{op}", cwd=elsewhere)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
