"""normcert's console (``presentation.console``, fed by ``run.news`` / ``run.announce``).

* its lines for a certified and a rejected run: the header, one line per finished check (pass with its
  fraction of the bound, FAIL with its first line), each failure once as a block, before the verdict;
* in a log (a file, a pipe) plain whole lines only: no progress bar, no control character; the bar on
  a terminal alone;
* a failure is printed once: ``outcomes`` raises pytest's failure ``from None``, so pytest no longer
  prints the ``PropertyFailure`` again as its context (also in a plain pytest run of the suite);
* pytest's session (rootdir, the temporary ini, module paths, item counts) is gone by default and
  back with ``-v`` / ``--pytest-output``, without torch's structured-trace records in its captured logs.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import traceback

import pytest

from normcert.properties.presentation.console import Console, interactive
from normcert.properties.run.announce import label

KERNELS = ("import torch\n\n"
           "def right(x, weight, eps):\n"
           "    compute = torch.float64 if x.dtype == torch.float64 else torch.float32\n"
           "    xf = x.to(compute)\n"
           "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(compute)).to(x.dtype)\n\n"
           "def wrong(x, weight, eps):\n"
           "    compute = torch.float32  # float64 computed in float32: the one line apart\n"
           "    xf = x.to(compute)\n"
           "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(compute)).to(x.dtype)\n")

START = {"kind": "start", "version": "0.1.0", "device": "cpu", "seed": 0, "profile": "ci", "kernels": ["rms_norm:k:f"],
         "ops": ["rms_norm"], "scope": {"properties": ["accuracy"], "dtypes": "all"}, "shard": None, "cells": 2}
BLOCK = ("accuracy fails for rms_norm:k:f (plugin) in float64: y[1]: got 1, exact 2\n"
         "  shrunk case: rms_norm(x: float64(2,), weight: float64(2,), eps=1e-12)\n"
         "  replay: normcert replay --impl rms_norm=k:f failures/x.npz")
EVENTS = [START,
          {"kind": "begin", "test": "accuracy rms_norm:k:f float64"},
          {"kind": "found", "line": "accuracy fails for rms_norm:k:f in float64 (a first case, shrunk next): y[0]"},
          {"kind": "cell", "impl": "rms_norm:k:f", "prop": "accuracy", "dtype": "float64", "outcome": "fail",
           "units": 0, "message": "y[1]: got 1, exact 2"},
          {"kind": "failure", "test": "accuracy rms_norm:k:f float64", "when": "call", "text": BLOCK},
          {"kind": "end", "test": "accuracy rms_norm:k:f float64"},
          {"kind": "begin", "test": "accuracy rms_norm:k:f float32"},
          {"kind": "cell", "impl": "rms_norm:k:f", "prop": "accuracy", "dtype": "float32", "outcome": "pass",
           "units": 0.4213, "message": ""},
          {"kind": "end", "test": "accuracy rms_norm:k:f float32"},
          {"kind": "note", "line": "normcert: a note"}]


def _fed(out, live=None) -> Console:
    console = Console(out, live=live)
    for event in EVENTS:
        console.feed(event)
    console.close()
    return console


def test_the_log_form_is_whole_plain_lines():
    out = io.StringIO()
    assert not _fed(out).live  # a StringIO is no terminal
    assert out.getvalue().split("\n") == [
        "normcert 0.1.0 certify: rms_norm:k:f (op rms_norm) on cpu, profile ci, seed 0",
        "  scope: properties accuracy, every dtype; 2 checks",
        "normcert: accuracy fails for rms_norm:k:f in float64 (a first case, shrunk next): y[0]",
        "[1/2] FAIL  accuracy float64  y[1]: got 1, exact 2",
        "[2/2] pass  accuracy float32  0.421 of bound",
        "normcert: a note",
        "",
        "FAILED accuracy rms_norm:k:f float64",
        *BLOCK.split("\n"),
        ""]


def test_a_progress_bar_is_drawn_on_a_terminal_alone(tmp_path):
    """A terminal gets the bar (checks done, the test running, the time left); a file and a pipe never."""
    live = io.StringIO()
    _fed(live, live=True)
    assert "\r\x1b[K" in live.getvalue() and "1/2 checks" in live.getvalue() and "left" in live.getvalue()
    assert "left  accuracy float32" in live.getvalue()  # the test running (its kernel named in the header alone)
    assert "2/2 checks  0:00, judging" in live.getvalue()  # every check done: the verdict is being written
    with open(tmp_path / "log", "w") as f:
        assert not interactive(f)
        _fed(f)
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        assert not interactive(pipe)
        _fed(pipe)
    with os.fdopen(read) as r:
        piped = r.read()
    for text in ((tmp_path / "log").read_text(), piped):
        assert "checks" not in text.replace("2 checks", "") and not any(c in text for c in "\r\x1b\b")


def test_the_time_left_falls_while_a_check_runs():
    """The estimate is the mean finished check times the checks left, less the running one's time so
    far (at most one mean): a long check no longer raises it second by second."""
    now = [0.0]
    out = io.StringIO()
    console = Console(out, live=True, clock=lambda: now[0])
    console.feed(dict(START, cells=4))
    now[0] = 10.0
    console.feed(EVENTS[3])  # the first of 4 checks done at 10 s: 30 s left
    seen = []
    for t in (10.0, 12.0, 19.0, 25.0, 60.0):
        now[0] = t
        seen.append(console._bar(200).split(", ")[1].split(" left")[0])
    assert seen == ["~0:30", "~0:28", "~0:21", "~0:20", "~0:20"], seen


def test_a_test_is_named_by_its_family_and_parameters():
    assert label("p/test_accuracy.py::test_accuracy[rms_norm:k:f-float32]") == "accuracy rms_norm:k:f float32"
    assert label("p/test_agreement.py::test_agreement[NOTSET-float16]") == "agreement float16"  # no kernel applies
    assert label("p/test_masks.py::test_row_independence[k]") == "row-independence k"


def test_a_failure_is_raised_without_the_property_failure_as_its_context(monkeypatch):
    """pytest prints an exception's context after "During handling of the above exception": every
    failure was printed twice (the ``PropertyFailure``, then pytest's failure carrying it)."""
    from normcert.properties.harness.measure import PropertyFailure  # noqa: PLC0415
    from normcert.properties.run import outcomes  # noqa: PLC0415

    def fails(*args, **kwargs):
        raise PropertyFailure("accuracy fails for k in float64: y[0]")

    monkeypatch.setattr(outcomes, "run_family", fails)
    family = type("F", (), {"backward": False, "bitwise": False})()
    impl = type("I", (), {"expected_failure": None})()
    with pytest.raises(pytest.fail.Exception) as e:
        outcomes.certify(None, family, impl, None)
    printed = "".join(traceback.format_exception(e.value))
    assert printed.count("accuracy fails for k in float64: y[0]") == 1 and "During handling" not in printed


def _certify(cwd, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(cwd / ".hyp")
    return subprocess.run([sys.executable, "-m", "normcert", "certify", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


SESSION = ("test session starts", "rootdir:", "configfile:", "pytest.ini", "passed", "properties/suite/test_")


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "mykern.py").write_text(KERNELS)
    return tmp_path


def test_a_certified_and_a_rejected_run_print_normcert_s_console(folder):
    """From a user's folder, standard output a pipe: the console's lines, plain; each failure once."""
    scope = ("--property", "extremes", "--dtype", "float64")
    good = _certify(folder, "rms_norm=mykern:right", *scope)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    lines = good.stdout.splitlines()
    assert lines[0].startswith("normcert ") and lines[0].endswith(
        " certify: rms_norm:mykern:right (op rms_norm) on cpu, profile ci, seed 0")
    assert lines[1] == "  scope: properties extremes, dtypes float64; 1 check"
    assert lines[2].startswith("[1/1] pass  extremes float64  ") and lines[2].endswith(" of bound")
    assert "normcert verdict: certified" in good.stdout
    bad = _certify(folder, "rms_norm=mykern:wrong", *scope)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    said = bad.stdout
    first = said.index("normcert: extremes fails for rms_norm:mykern:wrong in float64 (a first case, shrunk next)")
    cell = said.index("[1/1] FAIL  extremes float64  ")
    block = said.index("\nFAILED extremes rms_norm:mykern:wrong float64\nextremes fails for rms_norm:mykern:wrong "
                       "(plugin) in float64: ")
    assert first < cell < block < said.index("normcert verdict: not certified")
    assert said.count("(plugin) in float64: ") == 1 and said.count("\n  replay: normcert replay ") == 1
    assert "During handling" not in said + bad.stderr
    for run in (good, bad):
        assert not any(c in run.stdout for c in "\r\x1b\b"), run.stdout
        assert not [s for s in SESSION if s in run.stdout], run.stdout


def test_pytest_s_session_is_back_with_the_flag(folder):
    out = _certify(folder, "rms_norm=mykern:right", "--property", "contract", "--dtype", "float64",
                   "--pytest-output")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "test session starts" in out.stdout and re.search(r"\n=+ \d+ passed", out.stdout), out.stdout
    assert "[1/1] pass" not in out.stdout and "normcert verdict: certified" in out.stdout


TRACING = ("import logging\n\n"
           "from mykern import wrong\n\n"
           "TRACE = logging.getLogger('torch.__trace')\n"
           "for name in ('torch', 'torch.__trace'):  # up to the root logger, as torch 2.11 let them on an H200\n"
           "    logging.getLogger(name).propagate = True\n\n"
           "def wrong_tracing(x, weight, eps):\n"
           "    TRACE.debug('')  # a structured-trace record: a payload for tlparse, empty as text\n"
           "    logging.getLogger('mykern').warning('the kernel says so')\n"
           "    return wrong(x, weight, eps)\n")


def test_pytest_s_captured_logs_leave_torch_s_structured_trace_out(folder):
    """A failure's captured log under ``--pytest-output`` keeps the kernel's own records and drops
    the ``torch.__trace`` ones (thousands of empty DEBUG lines per failure of a compiled kernel)."""
    (folder / "tracing.py").write_text(TRACING)
    out = _certify(folder, "rms_norm=tracing:wrong_tracing", "--property", "extremes", "--dtype", "float64",
                   "--pytest-output")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Captured log" in out.stdout and "the kernel says so" in out.stdout, out.stdout[-3000:]
    assert "torch.__trace" not in out.stdout + out.stderr


@pytest.mark.normcert_heavy  # two workers, each starting torch: the heavy tier
def test_the_lines_come_through_the_controller_with_workers(folder):
    """With ``-n 2`` the checks run in xdist's workers: the controller, which receives their reports,
    tells every check's line, once."""
    out = _certify(folder, "rms_norm=mykern:right", "--property", "contract", "--property", "extremes", "-n", "2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cells = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    assert len(cells) == 8 and cells[-1].startswith("[8/8] pass  "), out.stdout
    assert sorted(ln.split()[2:4] for ln in cells) == sorted(
        [p, d] for p in ("contract", "extremes") for d in ("float64", "float32", "float16", "bfloat16"))
