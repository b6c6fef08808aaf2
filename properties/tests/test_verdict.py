"""The verdict from the rows alone (``verdict.judge``), the headline's claims (``certificate.claimed``),
what a declared scope expects (``families.expected``) and how normcert writes its files (``files``).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from normcert.impls import registry

from ..evidence import certificate, files, verdict
from .. import families
from ..search.case import Case
from ..run.runner import Coverage
from .certificate_helpers import read_certificate


def _row(outcome, dtype="float32", prop="accuracy", message=""):
    return {"impl": "rms_norm:k", "prop": prop, "dtype": dtype, "outcome": outcome, "message": message}


EXPECTED = ["rms_norm:k accuracy float32"]


def test_a_failing_row_is_not_certified_whatever_pytest_says():
    judged, disagreement = verdict.judge([_row("fail")], EXPECTED, 0, [], "complete")
    assert judged == "not certified" and disagreement.startswith("pytest reported success (exit status 0)")
    assert verdict.judge([_row("error")], EXPECTED, 0, [], "complete")[0] == "not certified"


def test_certified_needs_every_expected_row_a_complete_run_and_pytest_s_zero():
    assert verdict.judge([_row("pass")], EXPECTED, 0, [], "complete") == ("certified", "")
    assert verdict.judge([_row("pass")], [*EXPECTED, "rms_norm:k masks float32"], 0, [], "complete")[0] == \
        "not certified"
    assert verdict.judge([_row("pass")], EXPECTED, 1, [], "complete")[0] == "not certified"
    assert verdict.judge([_row("pass")], EXPECTED, 0, ["node"], "complete")[0] == "not certified"
    assert verdict.judge([_row("pass")], EXPECTED, 0, [], "interrupted")[0] == "not certified"
    assert verdict.judge([], [], 0, [], "complete")[0] == "not certified"
    assert verdict.judge([_row("expected-fail"), _row("warn", "float16")], [], 0, [], "complete")[0] == "certified"


def test_undeclared_refusals_are_in_the_headline():
    rows = [_row("pass"), *(_row("not-supported", d, message="refused the op's sample") for d in ("float16", "bfloat16")),
            _row("not-supported", "float64", message=f"{certificate.DECLARED_OUT} (dtypes float32, float16, bfloat16)")]
    claims = certificate.claimed({"rms_norm:k": ""}, rows)
    assert claims == {"rms_norm:k": "refuses (undeclared) dtypes float16, bfloat16"}
    line = certificate.verdict_line("certified", claims, {"properties": "all", "dtypes": "all"}, "complete")
    assert line == "certified on: refuses (undeclared) dtypes float16, bfloat16"
    declared = certificate.claimed({"rms_norm:k": "dtypes float32, float16, bfloat16"}, rows)
    assert declared["rms_norm:k"] == "dtypes float32, float16, bfloat16; refuses (undeclared) dtypes float16, bfloat16"


def test_one_property_refused_in_a_dtype_whose_other_rows_ran_is_not_a_refused_dtype():
    """gradcheck refusing (undeclared) under no_grad while every other float64 row passed: the kernel
    does not refuse float64, and the headline says which property refused it."""
    rows = [_row("pass", "float64"), _row("pass", "float32"),
            _row("not-supported", "float64", "gradcheck", message="gradcheck refused under no_grad")]
    claims = certificate.claimed({"rms_norm:k": ""}, rows)
    assert claims == {"rms_norm:k": "gradcheck refused (undeclared) in float64"}
    rows.append(_row("not-supported", "float16", message="refused the op's sample"))
    assert certificate.claimed({"rms_norm:k": ""}, rows) == \
        {"rms_norm:k": "refuses (undeclared) dtypes float16; gradcheck refused (undeclared) in float64"}


def test_a_declared_property_that_cannot_run_here_is_expected():
    kernel = [i for i in registry() if i.op == "rms_norm" and i.backend == "eager"]
    want = families.expected(kernel, "cpu", False, "large", properties=["large"])
    assert {p for _, p, _ in want} == {"large"}  # so a CPU run of --property large is "not run"
    everything = families.expected(kernel, "cpu", False, "large")
    assert everything and "large" not in {p for _, p, _ in everything}  # undeclared, not a CPU run's to make


def test_no_write_goes_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    link = tmp_path / "cert.json"
    os.symlink(victim, link)
    with pytest.raises(files.UnsafePath):
        files.write_atomic(str(link), "{}")
    assert victim.read_text() == "theirs"
    os.symlink(victim, tmp_path / "new.json.tmp")  # the old fixed temporary name
    files.write_atomic(str(tmp_path / "new.json"), "{}")
    assert victim.read_text() == "theirs" and (tmp_path / "new.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".normcert-")] == []


def test_a_certificate_s_own_files_may_be_replaced(tmp_path):
    """(Somebody else's file at one of them is refused: ``test_outputs``.)"""
    certificate.write_incomplete(str(tmp_path / "c.json"), "test")
    certificate.check_writable(str(tmp_path / "c.json"))  # its own JSON, Markdown and badge


def test_ci_surfaces_a_badge_and_a_job_summary(tmp_path, monkeypatch):
    path = str(tmp_path / "c.json")
    certificate.write_incomplete(path, "test")
    assert json.loads((tmp_path / "c.badge.json").read_text()) == {
        "schemaVersion": 1, "label": "normcert", "message": "incomplete", "color": "lightgrey"}
    cert = read_certificate(tmp_path / "c.json")
    cert.update(verdict="not certified", results=[
        {**_row("fail", message="y[0]: got 1.0, exact 2.0 | more\nsecond line"), "property": "accuracy",
         "replay": "normcert replay failures/x.npz"}])
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    certificate.append_step_summary(cert)
    text = summary.read_text()
    assert text.startswith("### normcert: not certified")
    assert "| rms_norm:k | accuracy | float32 | y\\[0\\]: got 1.0, exact 2.0 \\| more |" in text
    assert "normcert replay failures/x.npz" in text and "second line" not in text
    assert certificate.badge(cert)["color"] == "red"


def test_a_result_s_domain_names_a_fitted_bucket_as_fitted():
    """The domain text describes the cases that ran: a bucket fitted into a declared domain changed shape."""
    cover = Coverage()
    plain = Case.sample("rms_norm", torch.float32)
    plain.notes["bucket"] = "odd"
    fitted = plain.copy()
    fitted.notes.update(bucket="many", fitted="row length 7 -> 8")
    cover.checked(plain)
    cover.checked(fitted)
    assert cover.domain.endswith("buckets: odd, many (fitted to the domain)"), cover.domain
