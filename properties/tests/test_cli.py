"""The ``normcert`` command and the plugin's manners in somebody else's pytest run.

* usage errors (a bad ``OP=MODULE:ATTR``, an unknown option value) exit 4 with
  one line naming the problem;
* ``normcert list`` prints the registry;
* the verdict table reads pass / FAIL / not certified per property and dtype;
* installed, the plugin loads into every pytest run: in a run that does not
  collect normcert's tests it changes nothing (Hypothesis profile, seed,
  ``TRITON_INTERPRET``), and ``--impl`` there is a usage error that says how
  to ask for normcert's tests.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from normcert.cli import verdict_table
from normcert.properties.evidence.certificate import SCHEMA, schema


def _run(args, cwd, extra_env=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    env.update(extra_env)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_usage_errors_exit_4_with_one_line(tmp_path):
    bad_op = _run(["-m", "normcert", "certify", "softmax=normcert.impls.eager:rms_norm"], tmp_path)
    assert bad_op.returncode == 4, bad_op.stdout[-2000:] + bad_op.stderr[-2000:]
    (line,) = [ln for ln in bad_op.stderr.splitlines() if "softmax" in ln]
    assert "unknown op 'softmax'" in line and "Traceback" not in bad_op.stderr
    bad_profile = _run(["-m", "normcert", "certify", "rms_norm=normcert.impls.eager:rms_norm", "--profile", "x"],
                       tmp_path)
    assert bad_profile.returncode == 4 and "--profile" in bad_profile.stderr


def test_list_prints_the_registry(tmp_path):
    out = _run(["-m", "normcert", "list"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = out.stdout.splitlines()
    assert rows[0].split()[:3] == ["op", "name", "backend"]
    assert any(r.split()[:3] == ["rms_norm", "eager", "eager"] for r in rows)


def test_verdict_table():
    def r(prop, dtype, outcome, units=0.0, ulps=9e15):
        return {"impl": "rms_norm:k", "prop": prop, "dtype": dtype, "outcome": outcome, "worst_units": units,
                "worst_ulps": ulps}

    table = verdict_table([r("accuracy", "bfloat16", "pass", 0.48), r("accuracy", "float64", "fail", 9.0),
                           r("gradients", "float64", "not-supported")])
    assert table[0].split() == ["implementation", "property", "float64", "bfloat16"]
    # error / bound leads: ulps of a value near zero (9e15 here) say nothing about the verdict
    assert table[1].split() == ["rms_norm:k", "accuracy", "FAIL", "pass", "0.48", "of", "bound"]
    assert table[2].split() == ["rms_norm:k", "gradients", "not", "certified", "-"]


@pytest.mark.normcert_heavy  # the command end to end in a fresh process: the heavy tier
def test_plugin_is_inert_in_other_runs(tmp_path):
    # CI=true makes Hypothesis load its own built-in "ci" profile; normcert's profile of the same
    # name must not replace it in somebody else's run (a CI run once caught exactly that).
    # Their conftest claims the generic option names an ML project's conftest often does: the
    # installed plugin claims none of them (its options carry the normcert- prefix).
    (tmp_path / "conftest.py").write_text(
        "def pytest_addoption(parser):\n"
        "    for name in ('--device', '--seed', '--impl', '--certificate', '--replay', '--domain', '--bitwise',\n"
        "                 '--kernel-timeout', '--failures-dir', '--require-backward', '--meta-seeds'):\n"
        "        parser.addoption(name, default=None)\n")
    (tmp_path / "test_theirs.py").write_text(
        "import os\nfrom hypothesis import settings\n\n"
        "def test_untouched():\n"
        "    print('PROFILE', settings._current_profile, settings.default.max_examples,\n"
        "          os.environ.get('TRITON_INTERPRET'))\n")
    for ci in ({}, {"CI": "true"}):
        args = ["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider"]
        theirs = _run(args, tmp_path, ci)
        alone = _run([*args, "-p", "no:normcert"], tmp_path, ci)
        assert theirs.returncode == alone.returncode == 0, theirs.stdout[-2000:]
        seen = [ln for ln in theirs.stdout.splitlines() if ln.startswith("PROFILE")]
        assert seen and seen == [ln for ln in alone.stdout.splitlines() if ln.startswith("PROFILE")]
        assert seen[0].split()[3] == "None"
    misused = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--normcert-impl", "rms_norm=m:f"], tmp_path)
    assert misused.returncode == 4
    assert "--pyargs normcert.properties.suite" in misused.stderr


def test_schema_prints_the_certificate_schema(tmp_path):
    out = _run(["-m", "normcert", "schema"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = json.loads(out.stdout)
    assert printed == schema() and printed["$id"] == SCHEMA


def test_workers_without_pytest_xdist_are_a_usage_error_naming_the_option(tmp_path):
    hide = ("import sys; sys.modules['xdist'] = None; sys.argv = ['normcert', 'certify', "
            "'rms_norm=normcert.impls.eager:rms_norm', '-n', '2']; from normcert.cli import entry; entry()")
    out = _run(["-c", hide], tmp_path)
    assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.strip() == ("normcert certify: -n 2 needs pytest-xdist, which is not installed here: "
                                  "pip install pytest-xdist (or leave -n out)")


def test_news_is_read_in_whole_events(tmp_path, monkeypatch):
    """``certify`` reads the run's news file (``run.news``) event by event as it grows, never half a line."""
    from normcert.properties.run import news  # noqa: PLC0415

    path = tmp_path / "news"
    path.write_text('{"kind": "found", "line": "accuracy fails for k in float32: y[0]"}\n{"kind": "no')
    events, offset = news.read(str(path), 0)
    assert events == [{"kind": "found", "line": "accuracy fails for k in float32: y[0]"}]
    with open(path, "a") as f:
        f.write('te", "line": "partial"}\n')
    events, offset = news.read(str(path), offset)
    assert events == [{"kind": "note", "line": "partial"}] and offset == path.stat().st_size
    monkeypatch.setenv("NORMCERT_NEWS", str(path))
    news.say("second\nline")
    assert news.read(str(path), offset)[0] == [{"kind": "found", "line": "second line"}]
