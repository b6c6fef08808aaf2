"""The run's tiers (``scope.tiered``): the quick tier (the default ``pytest -n 2``) and the heavy
tier together certify every registry kernel, neither twice; on CPU the interpreted Triton kernels
are the heavy tier's, on a GPU every kernel is the quick tier's."""
from __future__ import annotations

import os
import subprocess
import sys

from ... import impls
from ...impls import registry
from ..run.scope import tiered


def test_the_tiers_split_the_registry():
    every = registry()
    quick, heavy = tiered(every, "quick", "cpu"), tiered(every, "heavy", "cpu")
    assert sorted(i.id for i in quick + heavy) == sorted(i.id for i in every)
    assert heavy and all(i.backend == "triton" for i in heavy)
    assert not any(i.backend == "triton" for i in quick)
    assert tiered(every, "all", "cpu") == every == tiered(every, "quick", "cuda")
    assert tiered(every, "heavy", "cuda") == []


def test_without_triton_the_registry_leaves_the_triton_kernels_out_and_keeps_the_rest(monkeypatch):
    every = impls.registry()
    monkeypatch.setattr(impls, "triton_installed", lambda: False)
    without = impls.registry()
    assert {i.id for i in without} == {i.id for i in every if i.backend != "triton"}
    assert any(i.backend == "triton" for i in every) and not any(i.backend == "triton" for i in without)



def test_beside_given_kernels_the_registry_imports_no_triton():
    """A run of given kernels needs the registry's eager kernels alone (``registry(triton=False)``):
    in a fresh process on CPU, neither that nor the interpreter's launch and program counts import
    triton, and no correction is installed until something does (``interpreter.imported``)."""
    code = ("import os, sys\nos.environ['TRITON_INTERPRET'] = '1'\n"
            "from normcert import impls\nfrom normcert.properties.harness import interpreter\n"
            "ids = [i.id for i in impls.registry(triton=False)]\n"
            "print(interpreter.launches(), interpreter.programs(0), interpreter.imported(), 'triton' in sys.modules)\n"
            "import triton\nprint(interpreter.imported())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.stdout.split() == ["0", "0", "False", "False", "True"], r.stdout + r.stderr[-2000:]
    every = impls.registry()
    assert {i.id for i in impls.registry(triton=False)} == {i.id for i in every if i.backend != "triton"}
