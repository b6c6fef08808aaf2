"""``normcert replay FILE --export repro.py`` (``evidence.reproducer``): a reproducer for an upstream
bug report.

* exported from the replay file of a planted bug (its source copied into a module of its own, as a
  kernel repository holds it), the script runs where normcert cannot be imported (``python -S``, a
  sys.path of the standard library, the site-packages folders and the kernel's folder, no user site,
  and an import of normcert refused outright, since an editable install would find it through any
  path) and prints normcert replay's failure line, exit 1; fixed, the kernel passes, exit 0; the
  case is inlined, or read from the replay file where it is large;
* the export writes by the rules for normcert's files (never over a file it did not write, nor the
  replay file), and refuses a failure it cannot stand for, in one line, exit 4.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import shlex
import sys
import sysconfig

import numpy as np
import pytest
import torch

from normcert import cli

from ... import impls
from ...oracle import OPS
from ..evidence import files, reproducer
from ..evidence.replay import save_failure
from ..harness.measure import PropertyFailure, Worst, check_against_oracle
from ..search.case import Case
from ..search.context import AS_TESTED, Context
from . import report_samples
from .meta.planted.rms_norms import rms_no_upcast

SPEC = "rms_norm=plantedkern:rms_no_upcast"

FIXED = """import torch


def rms_no_upcast(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
"""
"""The planted bug fixed: computed in float32."""

BLOCKED = """import runpy, sys
sys.path[:] = {paths!r}
class Refuse:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] == "normcert":
            raise ModuleNotFoundError("normcert is not installed here")
try:
    import normcert
    sys.exit("normcert is importable")
except ModuleNotFoundError:
    pass
sys.meta_path.insert(0, Refuse)
sys.argv = {argv!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _planted(folder) -> None:
    """The planted bug's source as a module of its own (``plantedkern``), needing torch only."""
    body = [ln for ln in inspect.getsource(rms_no_upcast).splitlines() if not ln.startswith("@")]
    (folder / "plantedkern.py").write_text("import torch\n\n\n" + "\n".join(body) + "\n")


def _failure(folder, monkeypatch, spec: str = SPEC, context: Context = AS_TESTED) -> str:
    """The kernel's accuracy failure on a float16 case called in ``context``'s grad mode, saved as
    normcert saves one; its path."""
    monkeypatch.syspath_prepend(str(folder))
    impl = impls.plugin(spec)
    values = np.linspace(-300, 300, 3 * 64).reshape(3, 64)  # x**2 past float16's range: the sum overflows
    x = torch.from_numpy(values).to(torch.float16)
    weight = torch.linspace(0.5, 1.5, 64, dtype=torch.float64).to(torch.float16)
    case = Case("rms_norm", {"x": x, "weight": weight}, {"eps": 1e-6}, context=context)
    with pytest.raises(PropertyFailure), torch.no_grad() if context.grad == "no_grad" else torch.enable_grad():
        check_against_oracle((impl.fn(x, weight, 1e-6),), case, Worst())
    return shlex.split(save_failure(impl, "accuracy", case, str(folder / "failures")))[-1]


def _replayed(replay: str, spec: str, folder) -> str:
    """normcert replay's failure line for ``replay`` through the kernel ``spec``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    theirs = subprocess.run([sys.executable, "-m", "normcert", "replay", replay, "--impl", spec], cwd=folder,
                            env=env, capture_output=True, text=True, timeout=300)
    assert theirs.returncode == 1, theirs.stdout[-3000:] + theirs.stderr[-2000:]
    (line,) = {ln for ln in theirs.stdout.splitlines() if ln.startswith("accuracy still fails for ")}
    return line


def _blocked(script, folder, *args) -> subprocess.CompletedProcess:
    """``script`` run where normcert cannot be imported (module docstring)."""
    paths = [p for p in sys.path if p and os.path.isdir(p) and os.path.abspath(p).startswith(sys.base_prefix)]
    paths += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], str(folder)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST_"))}
    env["PYTHONNOUSERSITE"] = "1"
    code = BLOCKED.format(paths=list(dict.fromkeys(paths)), argv=[str(script), *args])
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.normcert_heavy  # normcert replay and five scripts in fresh processes, each importing torch: the heavy tier
def test_the_reproducer_of_a_planted_bug_runs_without_normcert_and_prints_its_failure_line(tmp_path, monkeypatch,
                                                                                          capsys):
    _planted(tmp_path)
    replay = _failure(tmp_path, monkeypatch)
    line = _replayed(replay, SPEC, tmp_path)
    assert cli.main(["replay", replay, "--impl", SPEC, "--export", str(tmp_path / "repro.py")]) == 0
    assert "(the case inlined)" in capsys.readouterr().out
    text = (tmp_path / "repro.py").read_text()
    assert "import normcert" not in text and "from normcert" not in text
    ran = _blocked(tmp_path / "repro.py", tmp_path)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ran.stdout.strip() == line
    monkeypatch.setattr(reproducer, "INLINE_BYTES", 0)  # a large case: read from the replay file
    assert cli.main(["replay", replay, "--impl", SPEC, "--export", str(tmp_path / "large.py")]) == 0
    assert "reading " in capsys.readouterr().out
    assert _blocked(tmp_path / "large.py", tmp_path).stdout.strip() == line
    moved = tmp_path / "moved.npz"
    os.replace(replay, moved)
    assert _blocked(tmp_path / "large.py", tmp_path, str(moved)).stdout.strip() == line
    (tmp_path / "plantedkern.py").write_text(FIXED)
    held = _blocked(tmp_path / "repro.py", tmp_path)
    assert held.returncode == 0, held.stdout + held.stderr
    assert held.stdout.startswith("accuracy holds for rms_norm:plantedkern:rms_no_upcast on the ")


MODAL = """import torch


def rms_norm(x, weight, eps):
    compute = torch.float32 if torch.is_grad_enabled() else x.dtype  # no_grad: no upcast
    xf = x.to(compute)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(compute)).to(x.dtype)
"""
"""A kernel wrong only under ``torch.no_grad()`` (an inference path of its own)."""


@pytest.mark.normcert_heavy  # normcert replay and the script in fresh processes: the heavy tier
def test_the_reproducer_calls_the_kernel_in_the_recorded_context(tmp_path, monkeypatch, capsys):
    (tmp_path / "modal.py").write_text(MODAL)
    spec = "rms_norm=modal:rms_norm"
    replay = _failure(tmp_path, monkeypatch, spec, Context(grad="no_grad"))
    line = _replayed(replay, spec, tmp_path)
    assert "in context grad=no_grad: y[" in line
    assert cli.main(["replay", replay, "--impl", spec, "--export", str(tmp_path / "repro.py")]) == 0
    ran = _blocked(tmp_path / "repro.py", tmp_path)
    assert ran.returncode == 1 and ran.stdout.strip() == line, ran.stdout + ran.stderr


def test_the_export_writes_only_its_own_files_and_refuses_what_it_cannot_stand_for(tmp_path, monkeypatch, capsys):
    _planted(tmp_path)
    replay = _failure(tmp_path, monkeypatch)
    out = tmp_path / "repro.py"
    for _ in range(2):  # its own reproducer is replaced
        assert cli.main(["replay", replay, "--impl", SPEC, "--export", str(out)]) == 0
        assert not files.foreign(str(out), "reproducer")  # it begins with its mark
    capsys.readouterr()
    kernel = (tmp_path / "plantedkern.py").read_text()
    for target, problem in ((tmp_path / "plantedkern.py", "exists and is not a normcert reproducer"),
                            (replay, "the replay file exported: choose another path"), (tmp_path, "is a folder")):
        assert cli.main(["replay", replay, "--impl", SPEC, "--export", str(target)]) == cli.USAGE
        err = capsys.readouterr().err
        assert problem in err and err.count("\n") == 1, err
    assert (tmp_path / "plantedkern.py").read_text() == kernel
    values = np.linspace(-3, 3, 3 * 40).reshape(3, 40)
    _, elements, _, _ = report_samples.off_kernel(values)
    determinism = report_samples.write_replay(str(tmp_path), values, elements, prop="determinism")
    contract = report_samples.write_replay(str(tmp_path), values, None, prop="accuracy", suffix="-raised")
    for path, problem in ((determinism, "a determinism failure is not exported"),
                          (contract, "holds no exact values of a failing output")):
        assert cli.main(["replay", path, "--export", str(tmp_path / "other.py")]) == cli.USAGE
        err = capsys.readouterr().err
        assert problem in err and err.count("\n") == 1, err
    assert not (tmp_path / "other.py").exists()


def test_the_call_is_the_records_own_traced_by_name():
    assert reproducer.call_text(OPS["rms_norm"], {"x": 1, "weight": 2, "eps": 3}) == \
        "kernel(args['x'], args['weight'], args['eps'])"
    gated = OPS["rms_norm_gated"]  # an option passed by keyword, and left out where the case gives None
    given = {a.name: 1 for a in gated.args}
    assert reproducer.call_text(gated, given).endswith(", group_size=args['group_size'])")
    assert "group_size" not in reproducer.call_text(gated, {**given, "group_size": None})
    for name, rec in OPS.items():  # every op: its arguments passed by name, each at most once, or refused in words
        try:
            text = reproducer.call_text(rec, {a.name: 1 for a in rec.args})
        except reproducer.ExportError as e:
            assert str(e).startswith(f"{name}'s call does more than pass its arguments")
            continue
        assert all(text.count(f"args[{a.name!r}]") <= 1 for a in rec.args) and text.count("args[") >= 1, text
