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

import dataclasses
import os
import subprocess
import sys
import warnings

import jsonschema
import pytest

from ....impls import UsageError, make
from ....oracle import OPS
from ....oracle.formats import DTYPES
from ...declared.domain import Domain, DomainError, check_op, parse
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner
from ...run.outcomes import certify
from ...evidence import verdict
from ...evidence.certificate import _row, schema

from . import planted, planted_nothing
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


# ------------------------------------------------------------------ a domain no row fits
def _shortest(rec) -> int:
    """The shortest row of op record ``rec`` in an unrestricted domain: what fitting rounds a row up to."""
    return Domain().width(1, rec.halves, rec.width_multiple)


SHORTEST_PAST_1 = [op for op, rec in OPS.items() if _shortest(rec) > 1]  # the ops a max_width can fit to nothing


@pytest.mark.parametrize("op", SHORTEST_PAST_1)
def test_a_domain_no_row_of_the_op_fits_is_refused_naming_the_key(op):
    """max_width one short of the op's shortest row fits every case to 0 elements: refused in one line
    naming the source and the key; at the shortest row it is a domain like any other."""
    rec = OPS[op]
    shortest = _shortest(rec)
    with pytest.raises(DomainError, match=rf"^--domain: max_width={shortest - 1}: no row of {op} is that short, "
                                          rf"every case would be fitted to 0 elements: its shortest row is {shortest} "):
        check_op(parse(f"max_width={shortest - 1}"), rec, "--domain")
    check_op(parse(f"max_width={shortest}"), rec, "--domain")
    assert Domain(max_width=shortest).width(1, rec.halves, rec.width_multiple) == shortest


def test_the_issues_two_domains_are_among_them():
    """The issue's cases, derived from the records: group quant rows are multiples of 128, so max_width=100 is
    refused (tail=partial admits it); silu_and_mul's [gate | up] rows are even, so max_width=1 is."""
    assert _shortest(OPS["rms_norm_group_quant"]) == 128 and _shortest(OPS["silu_and_mul"]) == 2
    check_op(parse("max_width=100 tail=partial"), OPS["rms_norm_group_quant"], "--domain")
    with pytest.raises(DomainError, match=r"^--domain: max_width=100: .* shortest row is 102 \(its rows are \[gate "
                                          r"\| up\], twice the output row; width_multiple=51\)$"):
        check_op(Domain(max_width=100, width_multiple=51, tail="partial"), OPS["silu_and_mul_group_quant"], "--domain")


@pytest.mark.parametrize("fn", [planted_nothing.group_quant_forty_two, planted_nothing.group_quant_doubled_scales,
                                planted_nothing.silu_and_mul_forty_two], ids=lambda fn: fn.__name__)
def test_a_kernel_declaring_such_a_domain_is_not_registered(fn):
    op = "silu_and_mul" if fn is planted_nothing.silu_and_mul_forty_two else "rms_norm_group_quant"
    with pytest.raises(UsageError, match=rf"^'{fn.__name__}': normcert_domain: {fn.normcert_domain}: no row of {op} "):
        make(op, fn.__name__, "plugin", fn)


@pytest.mark.parametrize("kernel, domain, says", [
    ("rms_norm_group_quant=mykern:forty_two", (), "'mykern:forty_two': normcert_domain: max_width=100: no row of "
                                                  "rms_norm_group_quant is that short"),
    ("silu_and_mul=normcert.impls.eager:silu_and_mul", ("--domain", "max_width=1"),
     "--domain (for silu_and_mul:normcert.impls.eager:silu_and_mul): max_width=1: no row of silu_and_mul is that "
     "short")], ids=["normcert_domain", "--domain"])
def test_normcert_certify_refuses_it_before_any_case(tmp_path, kernel, domain, says):
    """From a user's folder (its own pytest.ini): exit status 4, one line naming the key, no case run."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "mykern.py").write_text("import torch\n\ndef forty_two(x, weight, eps, group, scale_format, layout):\n"
                                        "    raise SystemExit('called')\n\nforty_two.normcert_domain = 'max_width=100'\n")
    r = _certify(tmp_path, kernel, *domain)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: {says}"), lines


# ------------------------------------------------------------------ nothing checked is not a pass
ZERO_WIDTH = {"rms_norm_group_quant": Domain(max_width=100), "silu_and_mul": Domain(max_width=1)}
"""The issue's domains, built directly (``check_op`` refuses them as declared), which fit every case to 0 elements."""


def _on_nothing(session, family, fn, op):
    """``family``'s run on ``fn`` with its domain ``ZERO_WIDTH[op]`` set past the registry's check
    (``check_op`` refuses it): the run a domain that fits every case to 0 elements would get; its
    recorded result (a run that does not pass ends in PropertyFailure)."""
    def kernel(*args):  # fn without its normcert_domain, which make refuses
        return fn(*args)

    impl = make(op, fn.__name__, "plugin", kernel, target=f"{fn.__module__}:{fn.__name__}")
    object.__setattr__(impl, "domain", ZERO_WIDTH[op])  # the frozen record's domain, unchecked
    try:
        runner.run_family(session, family, impl, F32, max_examples=8, gating=not family.bitwise, shrink=False)
    except PropertyFailure as e:
        assert "checked nothing" in str(e), str(e)
    return session.results[-1]


@pytest.mark.parametrize("family", ["accuracy", "contract", "served"])
@pytest.mark.parametrize("fn, op", [(planted_nothing.group_quant_forty_two, "rms_norm_group_quant"),
                                    (planted_nothing.group_quant_doubled_scales, "rms_norm_group_quant"),
                                    (planted_nothing.silu_and_mul_forty_two, "silu_and_mul")],
                         ids=lambda v: getattr(v, "__name__", v))
def test_a_wrong_kernel_checked_on_nothing_is_not_run(session, fn, op, family):
    """The issue's scoped run: each family the kernel "passed" on 0-element cases is not-run, and fails the verdict."""
    res = _on_nothing(session, BY_NAME[family], fn, op)
    assert res.outcome == "not-run" and res.message.startswith(f"nothing checked: the {res.examples} cases held 0 "
                                                               f"elements"), (res.outcome, res.message)
    row = _row(dataclasses.asdict(res))  # the certificate's row, held to its schema
    jsonschema.validate({"results": [row], "$defs": schema()["$defs"]},
                        {"properties": {"results": schema()["properties"]["results"]}, "$defs": schema()["$defs"]})
    assert row["outcome"] == "not-run" and verdict.failing([row]), row
    if family == "served":  # its long run's case, fitted, holds no elements: none of its 2**16 calls is made
        assert res.calls == 0 and "long run: none (its case, fitted to the domain, holds no elements)" in res.modes


@pytest.mark.parametrize("family", ["batch-invariance", "row-independence"])
def test_the_families_that_crashed_on_0_elements_check_them(session, family):
    """They raised in normcert's own code (a reshape with -1 of 0 elements: ``error``); now they check
    the empty rows, find nothing, and say so."""
    from ....impls.eager import rms_norm_group_quant  # the correct kernel: its result is the family's own

    res = _on_nothing(session, BY_NAME[family], rms_norm_group_quant, "rms_norm_group_quant")
    assert res.outcome == "not-run", (res.outcome, res.message)


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
