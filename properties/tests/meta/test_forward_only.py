"""Forward-only kernels: not certified by the backward families, and failed only where asked.

A kernel whose outputs carry no grad_fn (every inference kernel) gets
``not-certified`` for gradients and gradcheck, in the certificate, the verdict
table and the terminal summary, and the run passes; ``--require-backward`` (a
training kernel) and a registration that promised a backward make it a failure;
a grad_fn on some inputs and not on others is always one, the op's 2x4 sample included.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ....impls import make
from ...families import BY_NAME
from ...run.outcomes import certify, certify_gradcheck
from ...harness.session import Session

from . import hostile, planted
from ..certificate_helpers import read_certificate


def _impl(fn, backward):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted:{fn.__name__}",
                backward=backward)


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path))


def test_a_plugged_forward_only_kernel_is_not_certified_and_does_not_fail(session):
    impl = _impl(planted.rms_forward_only, backward=None)
    with pytest.raises(pytest.skip.Exception, match=r"not-certified \(forward only\)"):
        certify(session, BY_NAME["gradients"], impl, torch.float32)
    with pytest.raises(pytest.skip.Exception, match=r"not-certified \(forward only\)"):
        certify_gradcheck(session, BY_NAME["gradcheck"], impl)
    # forward only on every case of the gradients family, not only on the op's sample
    assert [(r.prop, r.outcome) for r in session.results] == \
        [("gradients", "not-certified"), ("gradcheck", "not-certified")]
    assert all("forward only" in r.message and r.examples > 0 for r in session.results)


def test_a_kernel_forward_only_on_the_sample_alone_fails(session):
    """A grad_fn everywhere but on the 2x4 sample the gate looks at: its backward would never be
    checked; the gradients family's own cases show it."""
    impl = make("rms_norm", "detached_on_the_sample", "plugin", hostile.rms_detached_on_the_sample,
                target="normcert.properties.tests.meta.hostile:rms_detached_on_the_sample", backward=None)
    with pytest.raises(BaseException) as e:  # a skip ("not certified, forward only") must not pass for it
        certify(session, BY_NAME["gradients"], impl, torch.float32)
    assert isinstance(e.value, pytest.fail.Exception), e.value
    assert "y carries a grad_fn on this case but none on the op's sample" in str(e.value)
    assert session.results[-1].outcome == "fail"


@pytest.mark.parametrize("require, backward, why", [(True, None, "--require-backward"),
                                                    (False, True, "registered with backward")])
def test_forward_only_fails_where_a_backward_was_required(session, require, backward, why):
    session.require_backward = require
    with pytest.raises(pytest.fail.Exception, match=f"{why}, but its outputs carry no grad_fn"):
        certify(session, BY_NAME["gradients"], _impl(planted.rms_forward_only, backward), torch.float32)
    assert session.results[-1].outcome == "fail"


def test_a_grad_fn_on_some_inputs_only_fails(session):
    with pytest.raises(pytest.fail.Exception, match="carry a grad_fn on some inputs, none on this case"):
        certify(session, BY_NAME["gradients"], _impl(planted.rms_backward_on_small_rows, None), torch.float32)
    assert session.results[-1].outcome == "fail"


@pytest.mark.normcert_heavy  # the command end to end in a fresh process: the heavy tier
def test_cli_certifies_a_forward_only_kernel_and_says_so(tmp_path):
    cert = tmp_path / "cert.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    out = subprocess.run([sys.executable, "-m", "normcert", "certify",
                          "rms_norm=normcert.properties.tests.meta.planted:rms_forward_only", "--certificate", str(cert),
                          "--property", "gradients", "--property", "gradcheck", "--", "-p", "no:randomly"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "rms_forward_only not certified for gradients or gradcheck: forward only" in out.stdout
    assert "not certified (forward only)" in out.stdout.split("normcert verdict")[1]
    doc = read_certificate(cert)
    outcomes = {(r["property"], r["dtype"]): r["outcome"] for r in doc["results"]}
    assert set(outcomes.values()) == {"not-certified"} and len(outcomes) == 5, outcomes  # 4 dtypes + gradcheck
    assert doc["verdict"] == "certified" and doc["summary"] == {"not-certified": 5}


@pytest.mark.normcert_heavy  # a correct kernel certified on every family and dtype: the heavy tier
@pytest.mark.parametrize("fmt", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_a_plain_forward_only_triton_kernel_is_certified(session, fmt):
    """``.to(tl.float32)`` loads, a bf16 multiply, plain stores: certified for accuracy on the run's
    device (on CPU: under the corrected interpreter), gradients not certified."""
    impl = _plain_triton_impl()
    assert certify(session, BY_NAME["accuracy"], impl, fmt).outcome == "pass"
    with pytest.raises(pytest.skip.Exception, match=r"not-certified \(forward only\)"):
        certify(session, BY_NAME["gradients"], impl, fmt)


def test_the_plain_triton_kernel_fails_float64_for_its_fp32_eps(session):
    """Triton passes a Python float as an fp32 scalar (on a GPU, and under the corrected interpreter),
    so eps = 1e-6 enters a float64 row as 9.99999997e-07: hundreds of float64 ulps, rejected."""
    with pytest.raises(pytest.fail.Exception, match="accuracy fails .* in float64"):
        certify(session, BY_NAME["accuracy"], _plain_triton_impl(), torch.float64)


def _plain_triton_impl():
    pytest.importorskip("triton")
    from . import planted_triton  # noqa: PLC0415

    fn = planted_triton.rms_norm_plain
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted_triton:{fn.__name__}",
                backward=None)
