"""No certificate without evidence: normcert owns its run, and judges it from outside the kernel's process.

* the folder ``normcert certify`` is started from does not configure the run: its ``pytest.ini``
  (``addopts = -k contract``), its ``pyproject.toml``, its ``conftest.py`` and ``PYTEST_ADDOPTS``
  are not read;
* whatever narrows a run (``-k`` through ``--``, under xdist too; ``--co``, ``--setup-only``,
  ``--setup-plan``, ``--fixtures``; plain pytest with a ``-k``) leaves checks without a result:
  the run is "not certified", exit status 1, and the certificate lists them in ``not_run``;
  a declared scope (``--property``, ``--dtype``) is the honest way to narrow, and the certificate
  states it;
* a kernel that ends its process with ``os._exit(0)``, at import (under ``-n 2`` too) or in a
  call, gets exit status 1 and an "incomplete" certificate, never an older one left in place;
* a kernel whose thread keeps the process alive after the run is ended, and the run says so, in
  its certificate's run state too (judged again by ``compare``: not certified); so is
  one stuck outside the watchdog (a finalizer on its output that blocks, a module import that
  blocks): its process stops beating and is ended, with an incomplete certificate;
* a kernel that changes the working directory does not move the certificate; one that removes
  the certificate's folder gets one line and exit status 1, not a traceback;
* a declared domain (`--domain`, or the kernel's own, a flag's one value included) is what gets
  certified, and the verdict and certificate say so.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from .certificate_helpers import read_certificate

pytestmark = pytest.mark.normcert_heavy  # end-to-end runs of the command in fresh processes: the heavy tier

GOOD = "rms_norm=normcert.impls.eager:rms_norm"
PLANTED = "normcert.properties.tests.meta.planted"
SCOPE = ["--profile", "dev", "--dtype", "float32"]


def _certify(cwd, *args, env=()):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    environ.update(HYPOTHESIS_STORAGE_DIRECTORY=str(cwd / ".hyp"), **dict(env))
    return subprocess.run([sys.executable, "-m", "normcert", "certify", "--certificate", "c.json", *args], cwd=cwd,
                          env=environ, capture_output=True, text=True, timeout=300)


def _cert(cwd) -> dict:
    return read_certificate(cwd / "c.json")


def _said(r) -> str:
    return r.stdout[-3000:] + r.stderr[-3000:]


def test_the_folder_it_runs_from_does_not_configure_the_run(tmp_path):
    """A kernel repository's ini file, pyproject.toml, conftest.py and PYTEST_ADDOPTS would each keep
    accuracy from running (and the conftest would end the run); the run checks both families."""
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -k contract\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-k contract"\n')
    (tmp_path / "conftest.py").write_text("raise SystemExit('the folder conftest.py ran')\n")
    r = _certify(tmp_path, GOOD, *SCOPE, "--property", "accuracy", "--property", "contract",
                 env={"PYTEST_ADDOPTS": "-k contract"})
    assert r.returncode == 0, _said(r)
    cert = _cert(tmp_path)
    assert cert["verdict"] == "certified" and not cert["not_run"]
    assert {res["property"] for res in cert["results"]} == {"accuracy", "contract"}
    assert cert["config"]["inifile"] != str(tmp_path / "pytest.ini")


@pytest.mark.parametrize("narrowing", [["-k", "contract"], ["-k", "contract", "-n", "2"]], ids=["k", "k-xdist"])
def test_a_k_selection_is_not_certified(tmp_path, narrowing):
    r = _certify(tmp_path, GOOD, *SCOPE, "--", *narrowing)
    assert r.returncode == 1, _said(r)
    cert = _cert(tmp_path)
    assert cert["verdict"] == "not certified" and cert["pytest_exit_status"] == 1
    assert f"{GOOD.replace('=', ':')} accuracy float32" in cert["not_run"]
    assert {res["property"] for res in cert["results"]} == {"contract"}
    assert "check(s) of the run's scope did not run" in r.stdout


@pytest.mark.parametrize("option", ["--co", "--setup-only", "--setup-plan", "--fixtures"])
def test_a_run_that_checks_nothing_is_not_certified(tmp_path, option):
    r = _certify(tmp_path, GOOD, *SCOPE, "--property", "accuracy", "--", option)
    assert r.returncode == 1, _said(r)
    cert = _cert(tmp_path)
    assert cert["verdict"] != "certified" and cert["results"] == []


def test_plain_pytest_with_a_selection_is_not_certified(tmp_path):
    """The same rule in a plain pytest run (the plugin's own end of run): -k leaves accuracy undone."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "--pyargs", "normcert.properties.suite",
                        "--normcert-impl", GOOD, "--hypothesis-profile", "dev", "--normcert-dtype", "float32",
                        "--normcert-property", "accuracy,contract", "-k", "contract", "--normcert-certificate",
                        "c.json"],
                       cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, _said(r)
    cert = _cert(tmp_path)
    assert cert["verdict"] == "not certified" and cert["not_run"] == [f"{GOOD.replace('=', ':')} accuracy float32"]


@pytest.mark.parametrize("where, workers", [("at import", ["-n", "2"]), ("in the call", [])], ids=["import", "call"])
def test_a_kernel_that_exits_0_is_not_certified(tmp_path, where, workers):
    body = "    os._exit(0)\n    return x\n"
    source = "import os\nos._exit(0)\n" if where == "at import" else "import os\n"
    (tmp_path / "quits.py").write_text(source + "\ndef rms(x, weight, eps):\n" + body)
    (tmp_path / "c.json").write_text('{"run": "complete", "verdict": "certified"}\n')
    r = _certify(tmp_path, "rms_norm=quits:rms", *SCOPE, *workers)
    assert r.returncode == 1, _said(r)
    assert "exited with status 0 before normcert's end of run" in r.stderr
    assert (tmp_path / "c.json").read_text().startswith('{"run": "incomplete: ')
    assert _cert(tmp_path)["verdict"] == "incomplete"


def test_a_kernel_thread_that_outlives_the_run_is_ended(tmp_path):
    """A non-daemon thread keeps Python from exiting after the run; it is given --kernel-timeout."""
    (tmp_path / "lingers.py").write_text(
        "import threading\nimport torch\n\n"
        "def rms(x, weight, eps):\n"
        "    threading.Thread(target=threading.Event().wait, daemon=False).start()\n"
        "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n")
    r = _certify(tmp_path, "rms_norm=lingers:rms", *SCOPE, "--property", "contract", "--kernel-timeout", "2")
    assert r.returncode == 1, _said(r)
    assert "did not exit within 2 s of the end of its run" in r.stderr


def test_a_run_kept_alive_by_a_kernel_thread_stays_not_certified_when_judged_again(tmp_path):
    """A kernel module that starts a non-daemon thread that never ends, at import: the run's checks
    pass, normcert ends the process, and the certificate's run state says why ("complete, but then
    ... ended by normcert"), the state its verdict is judged from; so ``compare`` of its certificate
    against its twin's (the thread line left out: certified) judges it "not certified" and exits 1,
    and ``merge`` would not count it complete."""
    source = ("import threading\nimport torch\n\n{thread}\n\n\ndef rms(x, weight, eps):\n"
              "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n")
    (tmp_path / "lingers.py").write_text(source.format(thread="threading.Thread(target=threading.Event().wait, "
                                                              "daemon=False).start()"))
    (tmp_path / "twin.py").write_text(source.format(thread=""))
    args = (*SCOPE, "--property", "contract", "--kernel-timeout", "5")
    twin = _certify(tmp_path, "rms_norm=twin:rms", *args)
    assert twin.returncode == 0, _said(twin)
    os.replace(tmp_path / "c.json", tmp_path / "twin.json")
    r = _certify(tmp_path, "rms_norm=lingers:rms", *args)
    assert r.returncode == 1 and "did not exit within 5 s of the end of its run" in r.stderr, _said(r)
    cert = _cert(tmp_path)
    assert cert["verdict"] == "not certified" and [x["outcome"] for x in cert["results"]] == ["pass"]
    assert cert["run"].startswith("complete, but then the kernel's process did not exit within 5 s")
    assert (tmp_path / "c.md").read_text().startswith("# normcert certificate: not certified")
    compared = subprocess.run([sys.executable, "-m", "normcert", "compare", "twin.json", "c.json"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert compared.returncode == 1, _said(compared)
    assert "verdict: certified -> not certified (judged from the rows)" in compared.stdout
    assert "says 'not certified', but its rows say" not in compared.stdout


def test_a_kernel_that_changes_folder_does_not_move_the_certificate(tmp_path):
    (tmp_path / "away").mkdir()
    (tmp_path / "wanders.py").write_text(
        "import os\nimport torch\n\n"
        "def rms(x, weight, eps):\n"
        f"    os.chdir({str(tmp_path / 'away')!r})\n"
        "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n")
    r = _certify(tmp_path, "rms_norm=wanders:rms", *SCOPE, "--property", "contract")
    assert r.returncode == 0, _said(r)
    assert _cert(tmp_path)["verdict"] == "certified" and not (tmp_path / "away" / "c.json").exists()


def test_a_declared_domain_is_what_gets_certified_and_the_verdict_says_so(tmp_path):
    """An honest kernel that refuses rows not a multiple of 8 fails while it does not say so, and is
    certified once --domain declares it; the verdict, the certificate's headline and its record of
    the kernel state the domain."""
    kernel = "rms_norm=normcert.properties.tests.meta.hostile:rms_multiple_of_8_undeclared"
    r = _certify(tmp_path, kernel, *SCOPE, "--property", "accuracy")
    assert r.returncode == 1 and "refused the op's sample in float32" in _said(r), _said(r)
    r = _certify(tmp_path, kernel, *SCOPE, "--property", "accuracy", "--domain", "width_multiple=8")
    assert r.returncode == 0, _said(r)
    assert "normcert verdict: certified on: row length a multiple of 8" in r.stdout
    cert = _cert(tmp_path)
    record = cert["implementations"][kernel.replace("=", ":", 1)]
    assert record["domain"] == "width_multiple=8" and record["certified_on"] == "row length a multiple of 8"
    first = (tmp_path / "c.md").read_text().splitlines()[0]
    assert first.startswith("# normcert certificate: certified on: row length a multiple of 8"), first


def test_a_declared_flag_is_what_gets_certified(tmp_path):
    """A gated norm that gates after the norm only (flash-linear-attention's FusedRMSNormGated) declares
    its flag's one value on the kernel: it is certified on it, and the certificate says so."""
    kernel = "rms_norm_gated=normcert.properties.tests.meta.hostile:gated_after_norm_only"
    r = _certify(tmp_path, kernel, *SCOPE, "--property", "accuracy")
    assert r.returncode == 0, _said(r)
    assert "normcert verdict: certified on: norm_before_gate=yes" in r.stdout
    record = _cert(tmp_path)["implementations"][kernel.replace("=", ":", 1)]
    assert record["domain"] == "flags=norm_before_gate:yes" and record["certified_on"] == "norm_before_gate=yes"


def test_a_bad_domain_is_one_line_and_exit_4(tmp_path):
    r = _certify(tmp_path, GOOD, *SCOPE, "--domain", "width_multiple=eight")
    assert r.returncode == 4 and "--domain: width_multiple='eight': expected a whole number >= 1" in r.stderr
    assert "Traceback" not in _said(r)


def test_a_process_stuck_outside_the_watchdog_is_ended(tmp_path):
    """An import that blocks runs outside the watchdog: its heartbeat stops and normcert ends it."""
    (tmp_path / "blocks_at_import.py").write_text("import threading\nthreading.Event().wait()\n")
    (tmp_path / "c.json").write_text('{"run": "complete", "verdict": "certified"}')  # a stale certificate
    r = _certify(tmp_path, "rms_norm=blocks_at_import:rms", *SCOPE, "--property", "contract", "--kernel-timeout", "1")
    assert r.returncode == 1 and "made no progress for" in r.stderr and "ended by normcert" in r.stderr, _said(r)
    assert _cert(tmp_path)["verdict"] == "incomplete"


def test_an_output_finalizer_that_blocks_is_a_hung_kernel(tmp_path):
    """The kernel's own output objects are freed under the watchdog: a finalizer that blocks there
    is the kernel's hang, a failure, and the run goes on to its certificate."""
    r = _certify(tmp_path, "rms_norm=normcert.properties.tests.meta.hostile:rms_output_finalizer_blocks", *SCOPE,
                 "--property", "contract", "--kernel-timeout", "1")
    assert r.returncode == 1 and "hung: no result after" in _said(r), _said(r)
    assert _cert(tmp_path)["verdict"] == "not certified"


def test_a_certificate_folder_removed_mid_run_is_one_line_and_not_certified(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "remover.py").write_text(
        "import os, shutil\nfrom normcert.impls.eager import rms_norm\n\n"
        "def rms(x, weight, eps):\n"
        "    shutil.rmtree(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'out'), ignore_errors=True)\n"
        "    return rms_norm(x, weight, eps)\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    r = subprocess.run([sys.executable, "-m", "normcert", "certify", "--certificate", "out/c.json", "rms_norm=remover:rms",
                        *SCOPE, "--property", "contract"], cwd=tmp_path, env=environ, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "could not be written (" in r.stdout and "does not exist" in r.stdout, _said(r)
    assert "Traceback" not in _said(r) and "INTERNALERROR" not in _said(r) and "job summary" not in _said(r)


def test_the_oracle_is_built_before_the_kernel_is_imported_and_the_child_leaves_at_once(tmp_path):
    """The native oracle's build (``run.warmup.build_oracle``) has started, or is done, when the
    kernel's module is imported, so no kernel code runs before it; and the certified run's child
    leaves once its record is written (``cli.BOOT``): a kernel's ``atexit`` hook never runs."""
    (tmp_path / "early.py").write_text(
        "import atexit, threading\nimport torch\nfrom normcert.oracle import native\n\n"
        "building = any(t.name == 'normcert-oracle-build' for t in threading.enumerate())\n"
        "open('seen.txt', 'w').write(str(building or bool(native._chosen)))\n"
        "atexit.register(lambda: open('atexit.txt', 'w').write('ran'))\n\n"
        "def rms(x, weight, eps):\n"
        "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n")
    r = _certify(tmp_path, "rms_norm=early:rms", *SCOPE, "--property", "accuracy")
    assert r.returncode == 0, _said(r)
    assert (tmp_path / "seen.txt").read_text() == "True"
    assert not (tmp_path / "atexit.txt").exists()


def test_the_first_counterexample_is_printed_as_soon_as_it_is_found(tmp_path):
    """A planted bug's first failing case is printed by ``normcert certify`` while the run shrinks it
    (``run.news``), before pytest's report of the shrunk case; the verdict is the run's as before."""
    r = _certify(tmp_path, f"rms_norm={PLANTED}:rms_eps_outside_sqrt", *SCOPE, "--property", "accuracy")
    assert r.returncode == 1, _said(r)
    news = f"normcert: accuracy fails for rms_norm:{PLANTED}:rms_eps_outside_sqrt in float32 (a first case, shrunk next): "
    assert news in r.stdout, _said(r)
    assert r.stdout.index(news) < r.stdout.index(f"accuracy fails for rms_norm:{PLANTED}:rms_eps_outside_sqrt (plugin)")
    assert _cert(tmp_path)["verdict"] == "not certified"


def test_a_kernel_that_imports_triton_in_its_first_call_is_run_on_the_corrected_interpreter(tmp_path):
    """A run of given kernels installs the interpreter's corrections only once triton is imported:
    after the kernels' modules, or, for a kernel that imports it in its call, at its first call
    (``probes.on_sample`` corrects, then asks again); the certificate lists them."""
    (tmp_path / "lazy.py").write_text("def rms(x, weight, eps):\n"
                                      "    from normcert.impls.triton_norms import rms_norm\n\n"
                                      "    return rms_norm(x, weight, eps)\n")
    r = _certify(tmp_path, "rms_norm=lazy:rms", *SCOPE, "--property", "accuracy")
    assert r.returncode == 0, _said(r)
    made = _cert(tmp_path)["environment"]["triton_interpreter"]
    assert made is not None and "bfloat16" in made, made
