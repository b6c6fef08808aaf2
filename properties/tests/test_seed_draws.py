"""A seed draws the same cases whatever modules the process has imported (``search.constants``).

Hypothesis mixes literals read from every local module loaded so far into its draws; a module full
of integers imported between two runs of one seeded search changed its cases (and so a verdict
changed with the xdist split, and a kernel module's literals steered its own search), and the
literals were cached as files in the working folder.  Both runs here call a recording kernel on
the same cases, and no cache file names the module.
"""
from __future__ import annotations

import hashlib
import importlib
import sys
import uuid

import torch
from hypothesis.configuration import storage_directory

from ...impls import eager, make
from ..families import BY_NAME
from ..harness.session import Session
from ..run import runner

LITERALS = "\n".join(f"C{k} = {k * 7 + 3}, {k / 3!r}, {2 ** (k % 60) - 1}" for k in range(400))
"""A module's worth of integer and float literals: what a kernel module or a test helper may hold."""


def _cases_drawn(tmp_path) -> list[tuple]:
    """The (shape, bits) of each x the accuracy search of a seeded run hands a recording rms_norm."""
    seen = []

    def kernel(x, weight, eps):
        seen.append((tuple(x.shape), hashlib.sha256(x.detach().contiguous().numpy().tobytes()).hexdigest()))
        return eager.rms_norm(x, weight, eps)

    impl = make("rms_norm", "recording", "plugin", kernel, target="recording:kernel")
    session = Session(failures_dir=str(tmp_path / f"failures{len(list(tmp_path.iterdir()))}"))
    assert runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32, max_examples=40).outcome == "pass"
    return seen


def test_a_seed_draws_the_same_cases_after_a_module_of_literals_is_imported(tmp_path, monkeypatch):
    name = f"kernel_literals_{uuid.uuid4().hex}"  # a source of its own: no cache file of an earlier run names it
    before = _cases_drawn(tmp_path)
    (tmp_path / f"{name}.py").write_text(LITERALS + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        importlib.import_module(name)
        after = _cases_drawn(tmp_path)
    finally:
        sys.modules.pop(name, None)
    assert len(before) > 40 and after == before
    cached = storage_directory("constants", intent_to_write=False).path
    named = [p for p in cached.glob("*") if name in p.read_text(errors="replace")] if cached.is_dir() else []
    assert named == []
