"""Coverage of a Triton kernel's own paths: which ``@triton.jit`` functions ran, and which never did.

``planted_paths.rms_norm_dispatched`` launches ``_rms_rows`` below 32,768 rows and ``_rms_blocked``
from there on; no case reaches that many rows.  Its certificate names ``_rms_rows`` with the block
sizes it ran at, ``_rms_blocked`` as not reached (``_square``, a helper ``_rms_rows`` calls, is
reached through its caller's source), and its Markdown and HTML report say so; the verdict is the
rows' alone.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from ....impls import make
from ...evidence import code, coverage
from ...evidence.certificate import _row, implementations, markdown
from ...families import BY_NAME
from ...harness import launches
from ...harness.session import Session
from ...presentation import report
from ...run.outcomes import certify
from .. import report_samples
from ..certificate_helpers import read_certificate

triton = pytest.importorskip("triton")
from . import planted_paths  # noqa: E402 - imports triton

MODULE = "normcert.properties.tests.meta.planted_paths"
ROWS, BLOCKED, SQUARE = f"{MODULE}:_rms_rows", f"{MODULE}:_rms_blocked", f"{MODULE}:_square"


def _impl():
    fn = planted_paths.rms_norm_dispatched
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"{MODULE}:{fn.__name__}", backward=None)


def test_each_launch_is_counted_under_its_function_with_its_constexprs_and_launch_options():
    launches.record()
    launches.take()
    for n in (4, 100):
        planted_paths.rms_norm_dispatched(torch.ones(3, n), torch.ones(n), 1e-6)
    x = torch.ones(1, 4)
    planted_paths._rms_rows[(1,)](x, torch.ones(4), torch.empty_like(x), 4, 1e-6, BLOCK_SIZE=4, num_warps=2)
    with launches.paused():  # normcert's own probe kernels are launched so
        planted_paths.rms_norm_dispatched(torch.ones(3, 8), torch.ones(8), 1e-6)
    assert launches.take() == {ROWS: {"launches": 3, "meta": {"BLOCK_SIZE": [4, 128], "num_warps": [2]},
                                      "programs": [1, 3]}}
    assert launches.take() == {}
    x, asked = torch.ones(5, 4), []  # a callable grid: read from what it gives Triton, called by Triton alone
    planted_paths._rms_rows[lambda meta: asked.append(meta["BLOCK_SIZE"]) or (5, 1, 1)](
        x, torch.ones(4), torch.empty_like(x), 4, 1e-6, BLOCK_SIZE=4)
    assert asked == [4] and torch.allclose(x, torch.ones(5, 4))
    assert launches.take() == {ROWS: {"launches": 1, "meta": {"BLOCK_SIZE": [4]}, "programs": [5, 5]}}


def test_a_compiled_launch_is_counted_where_triton_launches_it_on_a_gpu():
    """``JITFunction.run``, the GPU's launch (on a machine without a GPU the launch fails for want of
    a driver after it is counted: a launch that raises was still made)."""
    from triton.runtime.jit import JITFunction  # noqa: PLC0415

    launches.record()
    launches.take()
    compiled = JITFunction(planted_paths._rms_rows.fn)
    x = torch.ones(1, 4, device="cuda" if torch.cuda.is_available() else "cpu")
    try:
        compiled[(1,)](x, torch.ones_like(x[0]), torch.empty_like(x), 4, 1e-6, BLOCK_SIZE=4, num_warps=8)
    except RuntimeError as e:
        assert not torch.cuda.is_available(), e  # "0 active drivers"
    assert launches.take() == {ROWS: {"launches": 1, "meta": {"BLOCK_SIZE": [4], "num_warps": [8]}, "programs": [1, 1]}}


def test_the_functions_of_a_module_and_those_their_sources_call():
    assert coverage.defined([MODULE]) == {ROWS: {SQUARE}, BLOCKED: {SQUARE}, SQUARE: set()}


def test_an_adapter_s_library_paths_not_reached_are_named_from_the_functions_it_launched():
    """A kernel whose code record names only the user's adapter (Liger's ``_block_rms_norm_*`` live
    in ``liger_kernel.ops.rms_norm``, behind ``liger.py``): the modules of the functions it launched
    are read too, so the library's dispatch it never reached is named, not left out."""
    rows = [{**report_samples.row("k", "accuracy", "float32"), "launches": {ROWS: {"launches": 2, "meta": {}}}}]
    listed = coverage.record("k", rows, ["normcert.properties.tests.meta.test_coverage"])
    assert list(listed["ran"]) == [ROWS] and listed["not_reached"] == [BLOCKED]


def test_a_module_of_the_code_record_never_imported_under_its_name_is_passed_over():
    """A kernel's code record names files by module; one not in ``sys.modules`` (an eager kernel's
    package, triton imported only for the certificate's versions) defines nothing reached or not:
    the certificate is written, where it raised and left the run incomplete."""
    assert "triton" in sys.modules and "no.such.module" not in sys.modules
    assert coverage.defined(["no.such.module", planted_paths.__name__]) == coverage.defined([planted_paths.__name__])


def test_the_certificate_names_the_path_that_ran_with_its_block_sizes_and_the_one_never_reached(normcert_session,
                                                                                                 tmp_path):
    session = Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path))
    impl = _impl()
    session.impls = [impl]
    certify(session, BY_NAME["accuracy"], impl, torch.float32)
    rows = [_row(dataclasses.asdict(r)) for r in session.results]
    listed = implementations(session, code.of({impl.id: impl.target}), rows)[impl.id]["triton"]
    assert list(listed["ran"]) == [ROWS] and listed["not_reached"] == [BLOCKED]
    ran = listed["ran"][ROWS]
    assert ran["launches"] == rows[0]["launches"][ROWS]["launches"] > 1
    assert len(ran["meta"]["BLOCK_SIZE"]) > 1 and all(b & (b - 1) == 0 for b in ran["meta"]["BLOCK_SIZE"])

    cert = report_samples.build([{**report_samples.row(impl.id, "accuracy", "float32"), "launches": rows[0]["launches"]}],
                                {impl.id: {**report_samples.impl("rms_norm"), "triton": listed}}, "certified",
                                scope={"properties": ["accuracy"], "dtypes": ["float32"]})
    lo, hi = ran["programs"]  # each launch one program a row: the cases' fewest and most rows
    assert 1 <= lo < hi <= 1025
    sizes = ", ".join(map(str, ran["meta"]["BLOCK_SIZE"]))
    said = (f"Triton functions run: _rms_rows (BLOCK_SIZE {sizes}; {ran['launches']} launches of {lo} to {hi} "
            f"programs); not reached: _rms_blocked")
    assert coverage.describe(listed) == said
    assert said.replace("_", "\\_") in markdown(cert)
    assert said in report.render(cert) and 'id="triton-paths"' in report.render(cert)


def test_a_kernel_without_triton_functions_has_no_coverage_and_coverage_never_judges():
    assert coverage.record("k", [report_samples.row("k", "accuracy", "float32")], ["normcert.impls.eager"]) is None
    cert = report_samples.certified()
    kernel = next(iter(cert["implementations"]))
    cert["implementations"][kernel]["triton"] = {"ran": {}, "not_reached": ["example:_never"]}
    from ...evidence.verdict import rejudge  # noqa: PLC0415

    assert rejudge(report_samples.validate(cert)) == "certified"


@pytest.mark.normcert_heavy  # the command end to end, two xdist workers: the heavy tier
def test_two_workers_launches_reach_one_certificate_and_its_report(tmp_path):
    """Each worker's rows carry its own launches; the controller names what no worker reached."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    run = subprocess.run([sys.executable, "-m", "normcert", "certify", f"rms_norm={MODULE}:rms_norm_dispatched",
                          "--certificate", "c.json", "--report", "r.html", "-n", "2", "--property", "accuracy",
                          "--dtype", "float32", "--dtype", "float16", "--profile", "dev"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    cert = read_certificate(tmp_path / "c.json")
    rows = {r["dtype"]: r["launches"][ROWS]["launches"] for r in cert["results"]}
    listed = next(iter(cert["implementations"].values()))["triton"]
    assert sorted(rows) == ["float16", "float32"] and listed["ran"][ROWS]["launches"] == sum(rows.values())
    spans = [r["launches"][ROWS]["programs"] for r in cert["results"]]  # the workers' ranges joined
    assert listed["ran"][ROWS]["programs"] == [min(lo for lo, _ in spans), max(hi for _, hi in spans)]
    assert listed["not_reached"] == [BLOCKED]
    assert "not reached: \\_rms\\_blocked" in (tmp_path / "c.md").read_text()
    assert "not reached: _rms_blocked" in (tmp_path / "r.html").read_text()


def test_a_test_s_rows_hold_none_of_the_launches_a_test_before_it_made(request):
    """A meta-test launches kernels without recording a result; the next test's rows start afresh."""
    launches.record()
    planted_paths.rms_norm_dispatched(torch.ones(2, 4), torch.ones(4), 1e-6)  # as a test before it would
    suite = request.config.pluginmanager.get_plugin("normcert-suite")
    call = suite.pytest_runtest_call(request.node)
    next(call)  # the hook's part before the test runs
    assert launches.take() == {}
    with pytest.raises(StopIteration):
        next(call)
