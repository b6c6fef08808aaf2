"""Every distinct failure of a cell, not only the first (``runner._Search.others``).

* a kernel with two bugs of different kinds in one (kernel, property, dtype) cell -- an assertion
  on an empty batch and a wrong value on every other batch -- leaves a row that lists both, each
  with its own shrunk case and replay file, and each file replays to its own failure; the row's
  first-failure fields, its verdict and its certificate entry (held to the schema) stay as a
  single failure's;
* a kernel with one bug lists exactly one;
* the kind that tells failures apart: an output and its failure class, an exception and its place,
  else the message without its numbers;
* ``normcert certify`` then ``normcert replay`` on each file, end to end (the heavy tier).
"""
from __future__ import annotations

import json
import pathlib
import shlex
import subprocess
import sys

import jsonschema
import pytest
import torch

from ....impls import make
from ...evidence import certificate, replay, verdict
from ...run import runner
from ...families import BY_NAME
from ...harness.measure import PropertyFailure, Worst
from ...harness.sandbox import ContractViolation
from ...harness.session import Session

from . import planted_distinct

PLANTED = planted_distinct.__name__
F32 = torch.float32


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   most_failures=runner.MOST_FAILURES)


def _impl(name: str):
    return make("rms_norm", name, "plugin", getattr(planted_distinct, name), target=f"{PLANTED}:{name}")


def _failing_row(session, name: str):
    with pytest.raises(PropertyFailure) as raised:
        runner.run_family(session, BY_NAME["accuracy"], _impl(name), F32)
    return session.results[-1], str(raised.value)


def _replays(session, name: str, command: str):
    """What the check raises on the case of the replay file ``command`` names."""
    meta, case = replay.load(shlex.split(command)[-1], session.device)
    assert meta["property"] == "accuracy" and meta["impl"] == f"rms_norm={PLANTED}:{name}"
    with pytest.raises(AssertionError) as raised:
        BY_NAME["accuracy"].check(session, _impl(name), case, Worst())
    return raised.value, case


def test_two_bugs_of_different_kinds_are_both_listed_each_replaying_to_its_own(session):
    res, said = _failing_row(session, "rms_two_bugs")
    assert res.outcome == "fail" and len(res.failures) == 2, res.failures
    first, other = res.failures
    assert (first["message"], first["where"], first["replay"]) == (res.message, res.worst_where, res.replay)
    crash = next(f for f in res.failures if "raised AssertionError" in f["message"])
    value = next(f for f in res.failures if f is not crash)
    assert "x.stride(0) of an empty batch" in crash["message"] and "planted_distinct.py:" in crash["kind"]
    assert value["kind"] == "y: over the bound" and value["worst_units"] > 1 and "worst_units" not in crash
    assert len({f["replay"] for f in res.failures}) == 2 and all(f["replay"] in said for f in res.failures)
    e, case = _replays(session, "rms_two_bugs", crash["replay"])
    assert isinstance(e, ContractViolation) and "x.stride(0) of an empty batch" in str(e)
    assert case.main.numel() == 0
    e, case = _replays(session, "rms_two_bugs", value["replay"])
    assert isinstance(e, PropertyFailure) and e.kind == "y: over the bound" and case.main.numel() > 0
    rows = [certificate.finite_json(certificate._row(r.__dict__)) for r in session.results]
    assert rows[-1]["failures"] == certificate.finite_json(res.failures)
    jsonschema.validate(rows[-1], {"$defs": certificate.schema()["$defs"], "$ref": "#/$defs/result"})
    assert verdict.failing(rows) == ["rms_norm:rms_two_bugs accuracy float32"]  # one cell, failed once


def test_one_bug_is_listed_once(session):
    res, said = _failing_row(session, "rms_halves_last_column")
    assert [f["kind"] for f in res.failures] == ["y: over the bound"]
    assert res.failures[0]["replay"] == res.replay and "another kind" not in said
    assert len(list(pathlib.Path(session.failures_dir).glob("*.npz"))) == 1


def test_a_failure_kind_names_its_output_and_class_else_the_message_without_numbers():
    assert runner.kind_of(PropertyFailure("y[3, 4]: got nan", kind="y: NaN pattern"), "y[3, 4]") == "y: NaN pattern"
    assert runner.kind_of(ContractViolation("k raised E: m", kind="k raised E at f.py:3"), "") == "k raised E at f.py:3"
    shape = [runner.kind_of(ContractViolation(m), m) for m in ("k returned y of shape (3, 4), expected (3, 5)",
                                                               "k returned y of shape (0, 7, 2), expected (1, 7, 2)")]
    assert shape[0] == shape[1] == "ContractViolation: k returned y of shape (#), expected (#)"
    assert runner.kind_of(ContractViolation("a"), "a") != runner.kind_of(PropertyFailure("a"), "a")


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_the_command_line_lists_both_failures_and_replays_each(tmp_path):
    run = subprocess.run([sys.executable, "-m", "normcert", "certify", f"rms_norm={PLANTED}:rms_two_bugs",
                          "--dtype", "float32", "--property", "accuracy", "--failures-dir", str(tmp_path / "f"),
                          "--certificate", str(tmp_path / "cert.json")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    cert = json.loads((tmp_path / "cert.json").read_text())
    jsonschema.validate(cert, certificate.schema())
    (row,) = [r for r in cert["results"] if r["property"] == "accuracy"]
    assert row["outcome"] == "fail" and len(row["failures"]) == 2 and cert["verdict"] == "not certified"
    markdown = (tmp_path / "cert.md").read_text()
    for f in row["failures"]:
        assert f["replay"] in markdown
        again = subprocess.run([sys.executable, "-m", *shlex.split(f["replay"]), "--impl",
                                f"rms_norm={PLANTED}:rms_two_bugs"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert again.returncode == 1 and "accuracy still fails for rms_norm:" in again.stdout
        assert ("x.stride(0) of an empty batch" in again.stdout) == ("raised AssertionError" in f["message"])
