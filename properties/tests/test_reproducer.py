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

import ast
import inspect
import math
import os
import re
import runpy
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
from ..evidence import files, literals, reproducer
from ..evidence.replay import ReplayError, load, save_failure
from ..harness.measure import PropertyFailure, Worst, check_against_oracle
from ..search.case import Case
from ..search.context import AS_TESTED, Context
from . import report_samples
from .replay_helpers import restamped, rewrite
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
    assert "(the case as literals)" in capsys.readouterr().out  # 3 x 64 and 64 elements: small
    text = (tmp_path / "repro.py").read_text()
    assert "import normcert" not in text and "from normcert" not in text
    ran = _blocked(tmp_path / "repro.py", tmp_path)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ran.stdout.strip() == line
    monkeypatch.setattr(reproducer, "LITERAL_ELEMENTS", 0)  # a larger case: the replay file inlined
    assert cli.main(["replay", replay, "--impl", SPEC, "--export", str(tmp_path / "inlined.py")]) == 0
    assert "(the case inlined)" in capsys.readouterr().out
    assert _blocked(tmp_path / "inlined.py", tmp_path).stdout.strip() == line
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



def test_a_small_case_is_written_as_literals_bit_for_bit(tmp_path, monkeypatch, capsys):
    """A case of at most ``LITERAL_ELEMENTS`` elements is written as ``torch.tensor`` literals (a
    transposed view by its storage and strides; a subnormal, -0.0, an infinity and values needing every
    digit spelled exactly) and its script prints the line the archived form prints; a larger case,
    or one with a NaN payload, is archived."""
    _planted(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = impls.plugin(SPEC)
    values = torch.from_numpy(np.linspace(-300, 300, 3 * 64)).to(torch.float16)
    values[:4] = torch.tensor([2 ** -24, -0.0, 1 / 3, 65504.0], dtype=torch.float16)
    x = values.reshape(64, 3).t()  # (3, 64), strides (1, 3)
    weight = torch.linspace(0.5, 1.5, 64, dtype=torch.float64).to(torch.float16)
    case = Case("rms_norm", {"x": x, "weight": weight}, {"eps": 1e-6})
    with pytest.raises(PropertyFailure):
        check_against_oracle((impl.fn(x, weight, 1e-6),), case, Worst())
    replay = shlex.split(save_failure(impl, "accuracy", case, str(tmp_path / "failures")))[-1]
    assert cli.main(["replay", replay, "--impl", SPEC, "--export", str(tmp_path / "small.py")]) == 0
    assert "(the case as literals)" in capsys.readouterr().out
    text = (tmp_path / "small.py").read_text()
    assert "INLINE" not in text and "torch.tensor([" in text and re.search(r"as_strided\(\[3,\s+64\],\s+\[1,\s+3\]", text)
    assert "[6e-08, -0.0, 0.3333, 65500.0, " in text and max(map(len, text.splitlines())) <= 120
    assert _imported(text) == {"concurrent", "contextlib", "importlib", "json", "math", "os", "sys", "torch"}
    built = runpy.run_path(str(tmp_path / "small.py"))["load_case"]("cpu")
    _, stored = load(replay, "cpu")
    for name, t in stored.tensors.items():
        assert built[name].stride() == t.stride() and torch.equal(built[name].view(torch.int16), t.view(torch.int16))
    small = _ran(tmp_path / "small.py", capsys)
    monkeypatch.setattr(reproducer, "LITERAL_ELEMENTS", 3 * 64)  # x's 192 and weight's 64: over
    assert cli.main(["replay", replay, "--impl", SPEC, "--export", str(tmp_path / "archived.py")]) == 0
    assert "(the case inlined)" in capsys.readouterr().out
    assert small[0] == 1 and small == _ran(tmp_path / "archived.py", capsys), small
    assert _imported((tmp_path / "archived.py").read_text()) - _imported(text) == {"base64", "io", "numpy"}
    payload = torch.tensor([0x7E01], dtype=torch.int16).view(torch.float16)  # a NaN of another payload
    assert literals.source(payload) is None and literals.source(torch.tensor([math.nan], dtype=torch.float16))


def _imported(text: str) -> set:
    """The top-level packages a script imports."""
    return {alias.name.split(".")[0] for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import)
            for alias in node.names}


CONTEXTUAL = "normcert.properties.tests.meta.planted_context"


def _context_failure(folder, name: str, context: Context) -> str:
    """The planted context bug ``name``'s accuracy failure on a float32 case called in ``context``
    (autocast entered, torch's thread count set, as ``harness.calling`` does), saved as normcert
    saves one; its path."""
    impl = impls.plugin(f"rms_norm={CONTEXTUAL}:{name}")
    x = torch.from_numpy(np.linspace(-3, 5, 4 * 64).reshape(4, 64)).float()
    weight = torch.linspace(0.5, 1.5, 64)
    case = Case("rms_norm", {"x": x, "weight": weight}, {"eps": 1e-6}, context=context)
    threads = torch.get_num_threads()
    torch.set_num_threads(int(context.threads) if context.threads != "run" else threads)
    try:
        with torch.autocast("cpu", torch.bfloat16, enabled=context.autocast == "on"):
            y = impl.fn(x, weight, 1e-6)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(PropertyFailure):
        check_against_oracle((y,), case, Worst())
    return shlex.split(save_failure(impl, "accuracy", case, str(folder / "failures")))[-1]


def _ran(script, capsys) -> tuple[int, str]:
    """The exported ``script`` run in this process (the kernel importable here): its exit status and line."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the run that xdist workers make: a count of 2 is the context's alone
    try:
        with pytest.raises(SystemExit) as ended:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    return ended.value.code, capsys.readouterr().out.strip()


@pytest.mark.parametrize("name, context, says", [
    ("rms_autocast_bf16_statistics", Context(autocast="on"), "autocast=on"),
    ("rms_threads_drop_a_half", Context(threads="2"), "threads=2"),
])
def test_the_reproducer_applies_autocast_and_the_thread_count(tmp_path, capsys, name, context, says):
    """A failure that needs autocast, or two intra-op threads, is one in the script too (issue 53):
    exit 1 and the context named, as normcert replay names it."""
    replay = _context_failure(tmp_path, name, context)
    assert cli.main(["replay", replay, "--export", str(tmp_path / "repro.py")]) == 0
    capsys.readouterr()
    status, line = _ran(tmp_path / "repro.py", capsys)
    assert status == 1 and line.startswith(f"accuracy still fails for rms_norm:{CONTEXTUAL}:{name}: in context {says}: y["), line


def test_a_context_field_the_script_cannot_apply_is_refused_by_name(tmp_path, monkeypatch, capsys):
    """A recorded field or value the script has no way to apply (a cotangent's layout, or a field
    ``reproducer.APPLIED`` lacks, as a field added to ``Context`` is until it is given one) is
    refused in one line naming it: never dropped from the script unsaid."""
    replay = _context_failure(tmp_path, "rms_autocast_bf16_statistics", Context(autocast="on"))
    out = tmp_path / "repro.py"
    monkeypatch.delitem(reproducer.APPLIED, "autocast")
    assert cli.main(["replay", replay, "--export", str(out)]) == cli.USAGE
    err = capsys.readouterr().err
    assert "the calling context autocast=on, which a reproducer cannot apply" in err and err.count("\n") == 1, err
    monkeypatch.undo()
    rewrite(replay, lambda meta: meta["context"].update(dy="transposed"))
    assert cli.main(["replay", restamped(replay), "--export", str(out)]) == cli.USAGE
    err = capsys.readouterr().err
    assert "the calling context dy=transposed, which a reproducer cannot apply" in err and err.count("\n") == 1, err
    assert not out.exists()


INJECTED = "import pathlib; pathlib.Path('injected').write_text('ran')"


@pytest.mark.parametrize("field, value", [
    ("impl", f"rms_norm\n{INJECTED}\n#=normcert.impls.eager:rms_norm"),  # a line of its own in the script's first comment
    ("impl", f"rms_norm=normcert.impls.eager:rms_norm\n{INJECTED}"),
    ("impl", "layer_norm=normcert.impls.eager:layer_norm"),  # another op's kernel
    ("impl", "rms_norm=normcert.impls.eager:rms_norm@\n" + INJECTED),
    ("impl", "rms_norm=normcert.impls.eager:rms_norm; " + INJECTED),
    ("impl", ["rms_norm=normcert.impls.eager:rms_norm"]),
])
def test_a_replay_file_s_kernel_name_is_a_name_or_the_file_is_refused(tmp_path, monkeypatch, capsys, field, value):
    """No field of a replay file reaches the exported script but as data (issue 53): a file whose
    kernel name is not OP=MODULE:ATTR of Python names (OP its own op) is refused by ``replay.load``,
    in one line, exit 4, and no script is written; nothing it holds runs."""
    replay = _context_failure(tmp_path, "rms_autocast_bf16_statistics", Context(autocast="on"))
    rewrite(replay, lambda meta: meta.update({field: value}))
    replay = restamped(replay)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ReplayError, match=f"'{field}': .* expected rms_norm=MODULE:ATTR"):
        load(replay, "cpu")
    assert cli.main(["replay", replay, "--export", str(tmp_path / "repro.py")]) == cli.USAGE
    err = capsys.readouterr().err
    assert f"'{field}': " in err and err.count("\n") == 1, err
    assert not (tmp_path / "repro.py").exists() and not (tmp_path / "injected").exists()


def test_a_kernel_the_file_names_is_imported_by_its_script_only_where_normcert_s_or_given(tmp_path, capsys):
    """Without --impl the script imports the file's kernel only where it is normcert's own, as
    normcert replay does: any other is named again with --impl, and then exported; the header's
    kernel is the file's op and the validated names."""
    replay = _context_failure(tmp_path, "rms_autocast_bf16_statistics", Context(autocast="on"))
    foreign = "rms_norm=mykern.ops:rms_norm"
    rewrite(replay, lambda meta: meta.update(impl=foreign))
    replay = restamped(replay)
    out = tmp_path / "repro.py"
    assert cli.main(["replay", replay, "--export", str(out)]) == cli.USAGE
    err = capsys.readouterr().err
    assert f"not one of normcert's own; if you trust it, pass --impl {foreign}" in err and err.count("\n") == 1, err
    assert cli.main(["replay", replay, "--impl", foreign, "--export", str(out)]) == 0
    assert out.read_text().splitlines()[1] == f"# normcert reproducer: {foreign}"
