"""Triton's interpreter, as normcert runs it on CPU (``normcert.impls.interpreter``).

Pins each known gap between the interpreter and a GPU: on a bare interpreter
the probe kernel fails (so the correction is still needed, and the list in the
certificate is true), after ``install()`` it computes what a GPU computes, and
the run's session records the corrections it made.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from normcert.impls import interpreter  # noqa: E402

CHECK = """
import os, json
os.environ["TRITON_INTERPRET"] = "1"
from normcert.impls import interpreter, interpreter_probes as p
before = [interpreter._runs(p.float_probe), interpreter._runs(p.libdevice_probe)]
made = interpreter.install()
after = [interpreter._runs(p.float_probe), interpreter._runs(p.libdevice_probe)]
print(json.dumps({"before": before, "made": made, "after": after}))
"""


def test_the_interpreters_gaps_and_their_corrections():
    """In a fresh process (the corrections are process-wide): the gaps show, install() closes them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import json  # noqa: PLC0415

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"before": [False, False], "made": ["float scalars", "libdevice"], "after": [True, True]}


def test_the_session_records_the_corrections(normcert_session):
    if not interpreter.active():
        assert normcert_session.interpreter is None
    else:
        assert normcert_session.interpreter == ["float scalars", "libdevice"]
