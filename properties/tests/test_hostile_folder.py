"""The verdict from the evidence alone, tried from a hostile kernel folder (issue 37, items 1, 2, 7).

The folder holds a wrong kernel and every route by which a pytest plugin that passes failed
reports could reach the run: a ``*.dist-info`` with a ``[pytest11]`` entry point, a ``pytest.ini``
whose ``addopts`` loads it, ``PYTEST_PLUGINS``, a ``conftest.py`` that sets the session's exit
status to 0, an empty ``normcert/`` folder that would shadow the package, and links at the
certificate's temporary name and at the replay file's old fixed name.  ``normcert certify`` and plain
``pytest --pyargs normcert.properties.suite`` both say "not certified" and exit 1, and nothing is
written through a link.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from .certificate_helpers import read_certificate

pytestmark = pytest.mark.normcert_heavy  # end-to-end runs of the command in fresh processes: the heavy tier

PLUGIN = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome, report.longrepr = "passed", None
'''

CONFTEST = '''
def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
'''

KERNEL = '''
import torch


def rms(x, weight, eps):
    """Wrong on every row: 1% too large."""
    xf = x.float()
    return (1.01 * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
'''

SCOPE = ["--normcert-property", "accuracy", "--normcert-dtype", "float32"]


def _folder(tmp_path):
    for module in ("hostile_plugin", "hostile_ep", "hostile_env"):  # one per route (pytest registers a module once)
        (tmp_path / f"{module}.py").write_text(PLUGIN)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p hostile_plugin\n")
    info = tmp_path / "hostile-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pytest11]\nhostile = hostile_ep\n")
    (tmp_path / "wrongkern.py").write_text(KERNEL)
    victim = tmp_path / "victim.txt"
    victim.write_text("somebody else's file\n")
    (tmp_path / "failures").mkdir()
    os.symlink(victim, tmp_path / "failures" / "rms_norm-wrongkern_rms-accuracy-float32.npz")
    return victim


def _run(args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    env["PYTEST_PLUGINS"] = "hostile_env"
    env["PYTHONPATH"] = "."  # as CI scripts often set it: the folder itself on the path
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _certificate(path) -> dict:
    return read_certificate(path)


def test_normcert_certify_judges_the_rows_whatever_the_folder_holds(tmp_path):
    victim = _folder(tmp_path)
    (tmp_path / "normcert").mkdir()  # an empty folder named like the package
    r = _run(["-m", "normcert", "certify", "rms_norm=wrongkern:rms", "--certificate", "c.json",
              "--property", "accuracy", "--dtype", "float32", "--pytest-output"], tmp_path)  # pytest's header too
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "normcert verdict: not certified" in r.stdout and "FAIL" in r.stdout, out[-3000:]
    assert "collected" in out and "hostile" not in out.split("collected")[0], out[-3000:]  # no plugin of the folder's
    cert = _certificate(tmp_path / "c.json")
    assert cert["verdict"] == "not certified" and cert["summary"].get("fail", 0) >= 1
    assert victim.read_text() == "somebody else's file\n"  # the replay file's link was not written through
    saved = [shlex.split(row["replay"])[-1] for row in cert["results"] if row["replay"].startswith("normcert replay ")]
    assert saved and all(os.path.isfile(p) and not os.path.islink(p) for p in saved)  # its own new files


def test_plain_pytest_gives_the_same_verdict_from_that_folder(tmp_path):
    victim = _folder(tmp_path)
    r = _run(["-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "normcert.properties.suite",
              "--normcert-impl", "rms_norm=wrongkern:rms", "--normcert-certificate", "c.json", *SCOPE], tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    cert = _certificate(tmp_path / "c.json")
    assert cert["verdict"] == "not certified"
    assert "disagree" in (tmp_path / "c.md").read_text() and cert["disagreement"].startswith("pytest reported success")
    assert victim.read_text() == "somebody else's file\n"
