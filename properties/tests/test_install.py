"""normcert as a user installs it: a wheel, one import name, used from the kernel's own folder.

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

import os
import subprocess
import sys
from pathlib import Path

import pytest

import normcert

from .certificate_helpers import read_certificate

pytestmark = pytest.mark.normcert_heavy  # end-to-end runs of the command in fresh processes: the heavy tier

CHECKOUT = Path(normcert.__file__).resolve().parent.parent

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


@pytest.mark.skipif(not (CHECKOUT / "pyproject.toml").is_file(), reason="needs normcert's source checkout to build")
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


def test_no_module_is_imported_under_a_second_name():
    """The test files were collected under their installed names: no ``properties``,
    ``oracle`` or ``impls`` module exists beside ``normcert.*`` in this process."""
    generic = sorted(m for m in sys.modules if m.split(".")[0] in ("oracle", "impls", "properties"))
    assert not generic, f"imported under a second name: {generic}"
    assert __name__ == "normcert.properties.tests.test_install"
