"""normcert as a user installs it: a wheel, one import name, used from the kernel's own folder.

The quick tests keep the instructions in step with what CI checks: the README's install lines
(and the first tutorial's) are the lines ``.ci/wheel.sh`` runs as written in a fresh venv, which
``.ci/run`` runs; the GitHub Actions snippets of the README and ``docs/howto/ci.md`` install with those
lines and certify with the README's command; every data file of the package folders is package data
of ``pyproject.toml`` (so in the wheel).  The heavy test builds and uses the wheel:

Builds a wheel of this checkout, installs it into an empty target folder and,
from a folder that holds only the user's ``mykern.py``:

* nothing but ``normcert`` (and its metadata and script) is installed, so
  ``import properties`` fails;
* ``python -m normcert certify rms_norm=mykern:rms --certificate c.json``
  certifies a correct kernel (exit 0) with a certificate naming normcert's own
  version and no commit of the user's folder;
* ``pytest --pyargs normcert.properties.suite --impl rms_norm=mykern:bad``, with the
  current folder not on ``sys.path`` (``python -P``), rejects a wrong one (exit 1).
"""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import normcert

from .certificate_helpers import read_certificate

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

CHECKOUT = Path(normcert.__file__).resolve().parent.parent
in_checkout = pytest.mark.skipif(not (CHECKOUT / "pyproject.toml").is_file(), reason="reads normcert's source checkout")

MYKERN = '''
import torch



def rms(x, weight, eps):
    c = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = x.to(c)
    return (xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * weight.to(c)).to(x.dtype)


def bad(x, weight, eps):  # eps outside the square root
    c = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = x.to(c)
    return (xc / (xc.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight.to(c)).to(x.dtype)
'''


def _run(args, cwd, env):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.normcert_heavy  # end-to-end runs of the command in fresh processes: the heavy tier
@in_checkout
def test_wheel_certifies_a_kernel_from_the_users_folder(tmp_path):
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    built = _run(["-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                  str(CHECKOUT)], cwd=tmp_path, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("normcert-*.whl")
    installed = _run(["-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                     cwd=tmp_path, env=env)
    assert installed.returncode == 0, installed.stderr[-3000:]
    top = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")}
    assert top <= {"normcert", "bin"}, f"the wheel installs generic names: {sorted(top)}"
    assert (site / "normcert" / "oracle" / "native.c").is_file(), "the wheel must ship the oracle's C source"
    assert (site / "normcert" / "properties" / "presentation" / "report_templates" / "report.html").is_file(), \
        "the wheel must ship the report's templates"

    (work / "mykern.py").write_text(MYKERN)
    env.update(PYTHONPATH=str(site), HYPOTHESIS_STORAGE_DIRECTORY=str(tmp_path / "hyp"))
    where = _run(["-c", "import normcert; print(normcert.__file__)"], cwd=work, env=env)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    generic = _run(["-c", "import properties"], cwd=work, env=env)
    assert generic.returncode != 0 and "No module named 'properties'" in generic.stderr

    good = _run(["-m", "normcert", "certify", "rms_norm=mykern:rms", "--profile", "dev", "--certificate", "c.json"],
                cwd=work, env=env)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    assert "normcert verdict" in good.stdout
    cert = read_certificate(work / "c.json")
    assert cert["environment"]["normcert"] == normcert.__version__ and cert["environment"]["commit"] is None
    outcomes = {(r["property"], r["dtype"]): r["outcome"] for r in cert["results"]}
    assert outcomes[("accuracy", "bfloat16")] == "pass" and set(outcomes.values()) <= {"pass", "warn"}

    wrong = _run(["-P", "-m", "pytest", "-q", "-x", "--pyargs", "normcert.properties.suite",
                  "--normcert-impl", "rms_norm=mykern:bad", "--normcert-failures-dir", str(tmp_path / "failures")],
                 cwd=work, env=env)
    assert wrong.returncode == 1, wrong.stdout[-3000:] + wrong.stderr[-3000:]
    assert "fails for rms_norm:mykern:bad" in wrong.stdout


@pytest.mark.normcert_heavy
def test_no_module_is_imported_under_a_second_name():
    """The test files were collected under their installed names: no ``properties``,
    ``oracle`` or ``impls`` module exists beside ``normcert.*`` in this process."""
    generic = sorted(m for m in sys.modules if m.split(".")[0] in ("oracle", "impls", "properties"))
    assert not generic, f"imported under a second name: {generic}"
    assert __name__ == "normcert.properties.tests.test_install"


def _block(path: str, after: str, lang: str) -> list[str]:
    """The commands of the first ``lang`` code block after the line ``after`` in a Markdown file
    (comments and blank lines dropped)."""
    text = (CHECKOUT / path).read_text()
    block = re.search(rf"{re.escape(after)}\n.*?```{lang}\n(.*?)```", text, re.S).group(1)
    return [ln.split(" #")[0].strip() for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _wheel_script_lines() -> list[str]:
    text = (CHECKOUT / ".ci" / "wheel.sh").read_text()
    return re.search(r"# --- the README's install lines, as written.*?\n(.*?)# ---\n", text, re.S).group(1).splitlines()


INSTALL = ["pip install torch==2.13.0", "pip install build && python -m build normcert",
           "pip install normcert/dist/normcert-*.whl"]


@in_checkout
def test_the_readmes_install_lines_are_what_ci_runs():
    readme = _block("README.md", "## Install", "bash")
    assert readme[:3] == INSTALL and _wheel_script_lines() == INSTALL, (readme, _wheel_script_lines())
    assert readme[3:] == ["pip install triton==3.7.1"]
    assert "triton==3.7.1" in tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["test"]
    tutorial = _block("docs/tutorials/first-certificate.md", "## 1. Install torch, then normcert", "bash")
    assert tutorial == ["python3 -m venv .venv && . .venv/bin/activate", *INSTALL]
    ci = (CHECKOUT / ".ci" / "run").read_text()
    assert "\nbash .ci/wheel.sh\n" in ci and "pip install --quiet --disable-pip-version-check torch==2.13.0" in ci
    assert "pip install normcert\n" not in (CHECKOUT / "README.md").read_text()


@in_checkout
def test_the_ci_snippets_install_and_certify_as_ci_checks():
    certify = _block("README.md", "## Certify your kernel", "bash")
    assert certify == ["normcert certify rms_norm=mykern:rms_norm --certificate cert.json"]
    script = (CHECKOUT / ".ci" / "wheel.sh").read_text()
    assert f"\nexpect 0 {certify[0]} --report report.html\n" in script
    for path, after in (("README.md", "## In GitHub Actions"), ("docs/howto/ci.md", "## Your kernel, in GitHub Actions")):
        runs = [ln.split("run:", 1)[1].strip() for ln in _block(path, after, "yaml") if ln.startswith("- run:")]
        assert runs[0] == " && ".join(INSTALL), (path, runs)
        command = [r for r in runs if r.startswith("normcert certify")]
        assert command and command[0].startswith(certify[0].replace("cert.json", "certificate.json")), (path, runs)
        assert " -n " not in command[0], f"{path}: one kernel runs fastest without xdist workers"


@in_checkout
def test_every_data_file_is_package_data():
    """A file a run reads (the report's templates, the certificate's schema, the oracle's C source)
    is in the wheel only if pyproject names it as package data."""
    setup = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {package: CHECKOUT / folder for package, folder in setup["package-dir"].items()}
    declared = {package: patterns for package, patterns in setup["package-data"].items()}
    missing = []
    for package in setup["packages"]:
        top = max((p for p in folders if package == p or package.startswith(p + ".")), key=len)
        folder = folders[top].joinpath(*package[len(top) + 1:].split(".")) if package != top else folders[top]
        for f in folder.iterdir():
            if f.is_file() and f.suffix not in (".py", ".pyc"):
                rel = f.relative_to(folder).as_posix()
                if not any(fnmatch.fnmatch(rel, pat) for pat in declared.get(package, [])):
                    missing.append(f"{package}: {rel}")
        for sub in (d for d in folder.iterdir() if d.is_dir() and d.name != "__pycache__"
                    and not (d / "__init__.py").exists()):
            for f in sub.rglob("*"):
                rel = f.relative_to(folder).as_posix()
                if f.is_file() and not any(fnmatch.fnmatch(rel, pat) for pat in declared.get(package, [])):
                    missing.append(f"{package}: {rel}")
    assert not missing, f"data files not in the wheel (add them to [tool.setuptools.package-data]): {missing}"
    assert "native.c" in declared["normcert.oracle"]
