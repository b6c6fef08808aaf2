"""``--agree``: two kernels of one op must give the same bits (``families.agreement``).

Planted: rms_norm's eager kernel, (x rho) w rounded once, against rms_llama_order, (x rho)
rounded to x.dtype and then times w: each is correct (certified against the oracle), the
pair disagrees in its last bits and is rejected naming the element; the eager kernel under
another name (rms_once_twin) agrees with it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from ....impls import make
from ...run import runner
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from . import planted
from ..certificate_helpers import read_certificate

PLANTED = "normcert.properties.tests.meta.planted"


def _planted(fn, agrees_with=None):
    impl = make("rms_norm", fn.__name__, "plugin", fn, target=f"{PLANTED}:{fn.__name__}")
    return dataclasses.replace(impl, agrees_with=agrees_with)


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   eager=normcert_session.eager)


def test_two_correct_kernels_that_round_differently_disagree(session):
    once = _planted(planted.rms_once_twin)
    with pytest.raises(PropertyFailure) as e:
        runner.run_family(session, BY_NAME["agreement"], _planted(planted.rms_llama_order, once), torch.bfloat16)
    first = str(e.value).splitlines()[0]
    assert "agreement fails for rms_norm:rms_llama_order" in first and "differ in their bits" in first
    assert "rms_norm:rms_llama_order gives" in first and "rms_norm:rms_once_twin gives" in first
    (saved,) = os.listdir(session.failures_dir)
    with zipfile.ZipFile(os.path.join(session.failures_dir, saved)) as z:
        meta = json.loads(np.load(z.open("meta.npy")).tobytes())
    assert meta["agrees_with"] == f"rms_norm={PLANTED}:rms_once_twin"
    elements = meta["elements"]  # what the report's card draws: the differing elements, their ulps apart
    assert elements["kind"] == "agreement" and elements["output"] == "y" and elements["over"] >= 1
    assert elements["top"][0]["over"] and elements["top"][0]["ulps"] >= 1 and first.startswith(
        "agreement fails") and f"y{elements['index']}".replace(" ", "") in first.replace(" ", "")


def test_a_kernel_agrees_with_itself_under_another_name(session):
    res = runner.run_family(session, BY_NAME["agreement"], _planted(planted.rms_once_twin, session.eager["rms_norm"]),
                            torch.bfloat16)
    assert res.outcome == "pass" and res.examples > 0


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_the_command_line_certifies_each_and_rejects_the_pair_then_replays_it(tmp_path):
    # run with this process's environment as it is: under -n, an xdist worker's PYTEST_XDIST_WORKER,
    # which normcert's child run must not inherit (it would think itself a worker and record nothing)
    run = subprocess.run([sys.executable, "-m", "normcert", "certify", "--agree", f"rms_norm={PLANTED}:rms_once_twin",
                          f"rms_norm={PLANTED}:rms_llama_order", "--dtype", "bfloat16", "--property", "accuracy",
                          "--property", "agreement", "--failures-dir", str(tmp_path / "f"),
                          "--certificate", str(tmp_path / "cert.json")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    results = read_certificate(tmp_path / "cert.json")["results"]
    rows = {(r["impl"], r["property"]): r["outcome"] for r in results}
    once, llama = f"rms_norm:{PLANTED}:rms_once_twin", f"rms_norm:{PLANTED}:rms_llama_order"
    assert rows == {(once, "accuracy"): "pass", (llama, "accuracy"): "pass", (llama, "agreement"): "fail"}
    (row,) = [r for r in results if r["property"] == "agreement"]
    saved = shlex.split(row["replay"])[-1]  # the first failure's; each further distinct one has its own file
    kept = {shlex.split(f["replay"])[-1] for f in row.get("failures") or [row]}
    assert saved in kept and {str(p) for p in (tmp_path / "f").iterdir()} == kept
    again = subprocess.run([sys.executable, "-m", "normcert", "replay", str(saved)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 1 and f"agreement still fails for {llama}" in again.stdout, \
        again.stdout[-3000:] + again.stderr[-2000:]
    alone = subprocess.run([sys.executable, "-m", "normcert", "certify", "--agree", f"rms_norm={PLANTED}:rms_once_twin",
                            f"rms_norm={PLANTED}:rms_once_twin"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode == 4 and "give a second kernel of rms_norm" in alone.stderr, alone.stderr[-2000:]
