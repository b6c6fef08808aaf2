"""The certificate file tells the truth about the run, and bad paths are refused up front.

* standard JSON: no ``Infinity``/``NaN`` literals, the run's state on the first line;
* a run that dies (``os._exit(0)`` inside the kernel) exits 1 and leaves a certificate
  whose first line says "incomplete", never the previous run's verdict;
* a finished run records its verdict and pytest's exit status;
* an xdist worker that dies under a kernel is named in ``crashed`` and the run is
  not certified; Ctrl-C leaves a certificate whose first line says "interrupted" (a second
  Ctrl-C during pytest's handling of the first too, never "pytest reported success");
* ``--certificate`` that is a folder, ends in ``.md`` or has a folder for its
  ``.md``; ``--failures-dir`` that is a file; a kernel module that raises at
  import; an unknown ``--hypothesis-profile``; a bad replay file: one line, exit status 4.
* a replay file naming a kernel outside the registry is refused unless ``--impl``
  names it.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata

import pytest
import torch

import normcert

from ...impls import make, plugin
from ..evidence import code
from ..evidence.certificate import check_failures_dir, check_writable, implementations, to_json
from ..search.case import Case
from ..evidence.replay import save_failure
from . import report_samples
from .certificate_helpers import read_certificate

GOOD = "rms_norm=normcert.impls.eager:rms_norm"


def _env(cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(cwd / ".hyp")
    return env


def _run(args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(cwd), capture_output=True, text=True,
                          timeout=600)


# A correct float32 rms_norm that does something drastic on every drawn case (the dtype
# probe's 2 x 4 input passes, so the kernel counts as supporting float32).
_DRASTIC = ("import os, pathlib, time\nimport torch\n\n"
            "def rms(x, weight, eps):\n"
            "    if tuple(x.shape) != (2, 4):\n"
            "        {action}\n"
            "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n")


def test_json_is_standard_and_starts_with_the_run_state():
    text = to_json({"run": "complete", "worst": [float("inf"), float("-inf"), float("nan"), 1.5]})
    assert text.splitlines()[0] == '{"run": "complete",'
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}")) == {
        "run": "complete", "worst": ["inf", "-inf", "nan", 1.5]}


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_a_run_that_dies_leaves_an_incomplete_certificate(tmp_path):
    (tmp_path / "dies.py").write_text("import os\n\ndef rms(x, weight, eps):\n    os._exit(0)\n")
    (tmp_path / "c.json").write_text('{"run": "complete", "verdict": "certified"}\n')
    (tmp_path / "c.md").write_text("# normcert certificate: certified\n")
    r = _run(["-m", "normcert", "certify", "rms_norm=dies:rms", "--certificate", "c.json"], tmp_path)
    # os._exit(0) ends the kernel's process with status 0; the command judges it and neither lies
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "not certified: the kernel's process exited with status 0 before normcert's end of run" in r.stderr
    first = (tmp_path / "c.json").read_text().splitlines()[0]
    assert first.startswith('{"run": "incomplete: the kernel\'s process exited with status 0')
    assert read_certificate(tmp_path / "c.json")["verdict"] == "incomplete"
    assert "incomplete" in (tmp_path / "c.md").read_text().splitlines()[0]


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_a_finished_run_records_verdict_and_exit_status(tmp_path):
    r = _run(["-m", "normcert", "certify", GOOD, "--profile", "dev", "--certificate", "c.json",
              "--property", "accuracy", "--dtype", "float32"], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    cert = read_certificate(tmp_path / "c.json")
    assert (cert["run"], cert["verdict"], cert["pytest_exit_status"]) == ("complete", "certified", 0)
    assert cert["scope"] == {"properties": ["accuracy"], "dtypes": ["float32"]} and cert["not_run"] == []
    assert cert["results"][0]["domain"].startswith("rows <= ")
    assert (tmp_path / "c.md").read_text().startswith(
        "# normcert certificate: certified (scope: properties accuracy; dtypes float32)")


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_a_crashed_xdist_worker_is_recorded_and_not_certified(tmp_path):
    (tmp_path / "crashy.py").write_text(_DRASTIC.format(action="os._exit(3)"))
    r = _run(["-m", "normcert", "certify", "rms_norm=crashy:rms", "-n", "1", "--certificate", "c.json",
              "--property", "accuracy", "--dtype", "float32"], tmp_path)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    cert = read_certificate(tmp_path / "c.json")
    assert cert["verdict"] == "not certified" and cert["pytest_exit_status"] == 1
    assert [c.split("::")[-1] for c in cert["crashed"]] == ["test_accuracy[rms_norm:crashy:rms-float32]"]
    assert "crashed tests: " + cert["crashed"][0] in (tmp_path / "c.md").read_text()


def _sigint_as_at_a_terminal():
    """SIGINT's default disposition in the child: a shell starts a background job (``cmd &``,
    ``nohup``) with SIGINT ignored, the child inherits that, and Python then never raises
    KeyboardInterrupt: the run below would go on to its end (a CI job started so hung here)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_ctrl_c_leaves_an_interrupted_certificate(tmp_path):
    """float32 is checked, then the kernel hangs in float16 and the run is interrupted: the certificate
    and the verdict line printed with the table of what was checked both say so."""
    (tmp_path / "slow.py").write_text(_DRASTIC.format(
        action="if x.dtype == torch.float16: pathlib.Path('called').touch(); time.sleep(30)"))
    run = subprocess.Popen([sys.executable, "-m", "normcert", "certify", "rms_norm=slow:rms", "--certificate",
                            "c.json", "--property", "accuracy", "--dtype", "float32", "--dtype", "float16"],
                           cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_sigint_as_at_a_terminal)
    deadline = time.monotonic() + 300
    while not (tmp_path / "called").exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, out[-2000:] + err[-2000:]
    cert = read_certificate(tmp_path / "c.json")
    assert (tmp_path / "c.json").read_text().startswith('{"run": "interrupted"')
    assert (cert["verdict"], cert["pytest_exit_status"]) == ("not certified", 2)
    assert "run interrupted" in (tmp_path / "c.md").read_text().splitlines()[0]
    assert [r["outcome"] for r in cert["results"] if r["dtype"] == "float32"] == ["pass"]
    assert out.split("normcert verdict: ")[1].splitlines()[0].endswith("-- run interrupted"), out[-2000:]


# Ctrl-C once the first check has its row, and again while pytest reports the first (``timeout -s INT``
# signals the process, then its process group): pytest's handler never sets the exit status
_TWICE = ("import pytest\n\n"
          "@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_logfinish(nodeid, location):\n    raise KeyboardInterrupt\n\n"
          "@pytest.hookimpl(tryfirst=True)\ndef pytest_keyboard_interrupt(excinfo):\n    raise KeyboardInterrupt\n")


@pytest.mark.normcert_heavy  # an end-to-end run of pytest in a fresh process: the heavy tier
def test_a_second_ctrl_c_during_pytest_s_handler_still_leaves_an_interrupted_certificate(tmp_path):
    """The first GPU run's suite, stopped by ``timeout -s INT``, was recorded "complete" with "pytest
    reported success (exit status 0) but 8 result row(s) fail ... something in the run changed its
    reports": the second SIGINT cut pytest's KeyboardInterrupt handler short before it set the exit
    status.  The interrupt still unwinding through the session's end says what happened."""
    (tmp_path / "twice.py").write_text(_TWICE)
    (tmp_path / "wrong.py").write_text("def rms(x, weight, eps):\n    return 2 * x\n")
    r = _run(["-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "twice", "--pyargs",
              "normcert.properties.suite", "--normcert-impl", "rms_norm=wrong:rms", "--normcert-property", "accuracy",
              "--normcert-dtype", "float32", "--normcert-dtype", "float16", "--normcert-certificate", "c.json"], tmp_path)
    cert = read_certificate(tmp_path / "c.json")
    assert [(x["dtype"], x["outcome"]) for x in cert["results"]] == [("float32", "fail")], r.stdout[-2000:]
    assert (cert["run"], cert["verdict"], cert["pytest_exit_status"], cert["disagreement"]) == \
        ("interrupted", "not certified", 2, ""), r.stdout[-2000:]
    assert "reported success" not in r.stdout + r.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_run_ends_with_its_parent(tmp_path):
    """SIGTERM to ``normcert certify`` (what ``timeout`` and a CI runner send) ends its pytest child too,
    and the certificate says the run did not finish."""
    (tmp_path / "stuck.py").write_text(_DRASTIC.format(
        action="pathlib.Path('pid.tmp').write_text(str(os.getpid())); os.replace('pid.tmp', 'pid'); time.sleep(600)"))
    run = subprocess.Popen([sys.executable, "-m", "normcert", "certify", "rms_norm=stuck:rms", "--certificate",
                            "c.json", "--property", "accuracy", "--dtype", "float32"],
                           cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "pid").exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    child = int((tmp_path / "pid").read_text())
    run.send_signal(signal.SIGTERM)
    run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
    assert read_certificate(tmp_path / "c.json")["verdict"] == "incomplete"


@pytest.mark.parametrize("option, value, says", [
    ("--certificate", "folder", "is a folder"),
    ("--certificate", "c.md", "give the JSON path"),
    ("--certificate", "clash.json", "clash.md is a folder"),
    ("--failures-dir", "afile", "is a file, expected a folder"),
    ("--certificate", "link.json", "is not a regular file"),
    ("--certificate", "fifo.json", "is not a regular file"),
])
def test_bad_paths_are_refused(tmp_path, monkeypatch, option, value, says):
    """The checks the plugin runs before anything else (end to end: test_bad_module_or_profile...).
    A link, a FIFO or a device node is never replaced by the certificate (as root, /dev/full was)."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "clash.md").mkdir()
    (tmp_path / "afile").write_text("")
    monkeypatch.chdir(tmp_path)
    check = check_writable if option == "--certificate" else check_failures_dir
    with pytest.raises(pytest.UsageError) as e:
        check(value)
    assert str(e.value).startswith(f"{option} {value}: ") and says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.normcert_heavy  # a pytest run in a fresh process per case: the heavy tier
@pytest.mark.parametrize("args, says", [
    (["--normcert-impl", "rms_norm=boom:rms"], "importing module 'boom' raised SystemExit"),
    (["--normcert-impl", GOOD, "--hypothesis-profile", "nope"], "unknown profile"),
    (["--normcert-impl", GOOD, "--normcert-certificate", "folder"], "folder is a folder, expected a file path"),
    (["--normcert-impl", GOOD, "--normcert-kernel-timeout", "inf"],
     "--normcert-kernel-timeout inf: expected a finite number of seconds > 0"),
    (["--normcert-replay", "bad.npz"], "bad.npz: not a replay file"),
])
def test_bad_module_or_profile_is_a_usage_error(tmp_path, args, says):
    (tmp_path / "bad.npz").write_text("not an archive")
    (tmp_path / "folder").mkdir()
    (tmp_path / "boom.py").write_text("raise SystemExit('no')\n")
    r = _run(["-m", "pytest", "-p", "no:xdist", "--pyargs", "normcert.properties.suite", *args], tmp_path)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("where", [["--pyargs", "normcert.properties"], ["--pyargs", "normcert.properties.tests"],
                                   ["--pyargs", "normcert.properties.suite", "--pyargs", "normcert.properties.tests"]])
def test_a_kernel_is_certified_by_the_suite_alone(tmp_path, where):
    """A run that plugs a kernel in collects the suite's folder and nothing else: naming the whole
    package, or normcert's own tests beside the suite, is a one-line usage error naming the suite."""
    r = _run(["-m", "pytest", "-p", "no:xdist", *where, "--normcert-impl", "rms_norm=normcert.impls.eager:rms_norm"],
             tmp_path)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "give --pyargs normcert.properties.suite" in lines[0], r.stderr


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_replay_refuses_a_kernel_outside_the_registry(tmp_path):
    (tmp_path / "theirs.py").write_text("def rms(x, weight, eps):\n    return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        impl = plugin("rms_norm=theirs:rms")
    finally:
        sys.path.remove(str(tmp_path))
    case = Case("rms_norm", {"x": torch.ones(1, 2), "weight": torch.ones(2)}, {"eps": 1e-5})
    path = save_failure(impl, "accuracy", case, directory=str(tmp_path)).split()[-1]
    (tmp_path / "theirs.py").write_text("raise SystemExit('imported by a replay file')\n")
    refused = _run(["-m", "normcert", "replay", path], tmp_path)
    assert refused.returncode == 4 and "pass --impl rms_norm=theirs:rms" in refused.stderr, refused.stderr
    assert "imported by a replay file" not in refused.stdout + refused.stderr
    trusted = _run(["-m", "normcert", "replay", path, "--impl", GOOD], tmp_path)
    assert trusted.returncode == 0, trusted.stdout[-2000:] + trusted.stderr[-2000:]


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
@pytest.mark.parametrize("target", ["normcert.impls:os.system", "normcert.properties.tests.meta.hostile:rms_exits"])
def test_replay_refuses_normcert_names_outside_the_registry_and_the_planted_bugs(tmp_path, target):
    """A dotted ATTR under a normcert module reached os.system; a hostile test kernel is not a planted bug."""
    impl = make("rms_norm", target, "plugin", torch.nn.functional.rms_norm, target=target)
    case = Case("rms_norm", {"x": torch.ones(1, 2), "weight": torch.ones(2)}, {"eps": 1e-5})
    path = save_failure(impl, "accuracy", case, directory=str(tmp_path)).split()[-1]
    refused = _run(["-m", "normcert", "replay", path, "--kernel-timeout", "5"], tmp_path)
    assert refused.returncode == 4 and f"pass --impl rms_norm={target}" in refused.stderr, refused.stderr


def test_a_kernel_registered_for_another_device_is_not_in_the_certificate(normcert_session):
    """The registry's compiled kernels are registered for GPU runs: a CPU run does not list them (nor
    their declared domains in its headline), a GPU run does."""
    listed = implementations(normcert_session, {})
    assert set(listed) == {i.id for i in normcert_session.impls if normcert_session.device in i.devices}
    assert "rms_norm:eager" in listed
    assert ("rms_norm:compiled" in listed) == (normcert_session.device == "cuda")


def _kernel_folder(folder, helper: str = "SCALE = 1\n"):
    """A kernel module in ``folder`` as an author writes one: helpers beside it (one imported at the top,
    one inside the kernel), a package with a relative import, torch, and a file it does not import."""
    folder.mkdir()
    (folder / "codekern.py").write_text("import torch\nfrom codekern_helpers import SCALE\n\n\n"
                                        "def rms(x, weight, eps):\n    import codekern_pkg.deep\n"
                                        "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n")
    (folder / "codekern_helpers.py").write_text(helper)
    (folder / "codekern_pkg").mkdir()
    (folder / "codekern_pkg" / "__init__.py").write_text("from . import deep\n")
    (folder / "codekern_pkg" / "deep.py").write_text("import os\n")
    (folder / "codekern_unrelated.py").write_text("x = 1\n")


def _record_of(folder, monkeypatch) -> dict:
    """The code record of ``folder``'s codekern, imported from there (as ``normcert certify`` run in it would)."""
    for name in [n for n in sys.modules if n.startswith("codekern")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(folder))
    import importlib  # noqa: PLC0415

    importlib.import_module("codekern")
    return code.record("codekern")


def test_the_code_record_names_the_kernel_module_and_what_it_imports_from_its_folder(tmp_path, monkeypatch):
    """The kernel's module and the modules its imports reach in its folder (a helper imported inside the
    kernel too, a package's __init__), by content and module name: the same code in two folders has
    one digest, an edited helper another, named by ``code.changes``; torch and a file not imported are
    not in it, and a module of no installed distribution names none."""
    _kernel_folder(tmp_path / "a")
    _kernel_folder(tmp_path / "b")
    _kernel_folder(tmp_path / "c", helper="SCALE = 2\n")
    a = _record_of(tmp_path / "a", monkeypatch)
    assert set(a["files"]) == {"codekern", "codekern_helpers", "codekern_pkg", "codekern_pkg.deep"}
    assert a["within"] == "folder of codekern.py" and a["distribution"] is None
    assert a["files"]["codekern"] == hashlib.sha256((tmp_path / "a" / "codekern.py").read_bytes()).hexdigest()
    b = _record_of(tmp_path / "b", monkeypatch)
    assert b == a and code.changes(a, b) == []
    c = _record_of(tmp_path / "c", monkeypatch)
    assert c["digest"] != a["digest"]
    assert code.changes(a, c) == [f"codekern_helpers edited (sha256 {a['files']['codekern_helpers'][:12]} -> "
                                  f"{c['files']['codekern_helpers'][:12]})"]
    report_samples.validate(report_samples.build([], {"rms_norm:codekern:rms": {**report_samples.impl("rms_norm"),
                                                                                 "code": c}}, "not certified"))


def test_the_code_record_of_a_package_and_of_an_installed_release():
    """A module of a package (normcert's own, an editable install) is walked within its top-level
    package and names its distribution; a module of an installed release (torch) is named by the
    distribution's version and its own file alone (walking torch would read 1,699 files)."""
    import torch.nn.functional  # noqa: F401, PLC0415

    found = code.of({"eager": "normcert.impls.eager:rms_norm", "torch": "torch.nn.functional:rms_norm"})
    eager, functional = found["eager"], found["torch"]
    assert eager["within"] == "package normcert" and eager["distribution"] == {"name": "normcert",
                                                                                "version": normcert.__version__}
    assert {"normcert.impls.eager", "normcert.impls", "normcert", "normcert.oracle"} <= set(eager["files"])
    assert all(name.split(".")[0] == "normcert" for name in eager["files"])
    assert functional["distribution"] == {"name": "torch", "version": metadata.version("torch")}
    assert list(functional["files"]) == ["torch.nn.functional"]
    assert functional["within"] == f"module alone (installed torch {functional['distribution']['version']})"
