"""No verdict on nothing, and normcert's own findings kept out of Python's warning filters.

* a declared domain that no case of the kernel's op can fit (``domain.Domain.width(1) = 0``: a
  group quant's rows are multiples of its groups, a [gate | up] row is even) is a usage error
  before any case, one line naming the domain's source and key, exit status 4 from ``normcert
  certify``;
* a result whose checked cases held 0 elements is ``not-run``, never ``pass``, and so never
  certified; the families that crashed in normcert's own code on such cases (batch-invariance,
  row-independence) check them like any other;
* a non-gating outcome (``warn``) is a result row and a line of the terminal summary, never a
  ``warnings.warn``: under ``-W error`` / ``PYTHONWARNINGS=error`` a correct kernel is certified.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from ....impls import make
from ....oracle.formats import DTYPES
from ...families import BY_NAME
from ...harness.session import Session
from ...run.outcomes import certify

from . import planted
from ..certificate_helpers import read_certificate

F32, F64 = DTYPES[1], DTYPES[0]


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   eager=normcert_session.eager)


def _certify(cwd, *args, env=()):
    """``normcert certify`` from ``cwd`` (a user's folder), as test_evidence runs it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    environ.update(HYPOTHESIS_STORAGE_DIRECTORY=str(cwd / ".hyp"), **dict(env))
    return subprocess.run([sys.executable, "-m", "normcert", "certify", "--certificate", "c.json", *args], cwd=cwd,
                          env=environ, capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------ normcert's warnings are its own
def test_a_non_gating_failure_passes_its_test_under_warnings_as_errors(session):
    """A batch-invariance failure without --bitwise is a ``warn`` row, and its test passes even where
    every warning is an error: nothing of it goes through ``warnings.warn``."""
    impl = make("rms_norm", "rms_batch_dependent", "plugin", planted.rms_batch_dependent,
                target="normcert.properties.tests.meta.planted:rms_batch_dependent")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = certify(session, BY_NAME["batch-invariance"], impl, F64)
    assert res.outcome == "warn" and "differs in its bits" in res.message, (res.outcome, res.message)


BATCH_DEPENDENT = '''
import torch

def rms(x, weight, eps):
    """Right to the bound, with a reduction order that changes with the batch (a bits-only finding)."""
    xf = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    rows = xf.reshape(-1, x.shape[-1])
    sq = rows.pow(2)
    ms = (sq.cumsum(-1)[..., -1:] if rows.shape[0] > 1 else sq.flip(-1).cumsum(-1)[..., -1:]) / x.shape[-1]
    return (rows * torch.rsqrt(ms + eps)).reshape(x.shape).mul(weight.to(xf.dtype)).to(x.dtype)
'''


@pytest.mark.normcert_heavy  # a certify run in a fresh process: seconds
def test_a_correct_kernel_is_certified_under_pythonwarnings_error(tmp_path):
    """From a user's folder whose pytest.ini makes warnings errors, under PYTHONWARNINGS=error: the
    kernel's batch-invariance finding is a ``warn`` row and a terminal line, and it is certified."""
    (tmp_path / "mykern.py").write_text(BATCH_DEPENDENT)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    r = _certify(tmp_path, "rms_norm=mykern:rms", "--property", "batch-invariance", "--property", "accuracy",
                 "--dtype", "float64", env={"PYTHONWARNINGS": "error"})
    said = r.stdout[-3000:] + r.stderr[-3000:]
    assert r.returncode == 0, said
    cert = read_certificate(tmp_path / "c.json")
    assert cert["verdict"] == "certified", said
    outcomes = {row["property"]: row["outcome"] for row in cert["results"]}
    assert outcomes["batch-invariance"] == "warn" and outcomes["accuracy"] == "pass", outcomes
    assert "normcert: batch-invariance (not gating without --bitwise): rms_norm:mykern:rms in float64: " in r.stdout
