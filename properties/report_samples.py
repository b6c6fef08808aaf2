"""For the report's tests: small certificates built by hand, each held to the published schema.

``certified()`` is one kernel that passes everything, with a warning; ``failing(folder)`` is two
kernels with failures (one with a replay file written in ``folder`` in the replay format, one with
an exception and non-finite numbers), a kernel not certified on float64, a hostile kernel id and
message, and checks that did not run.  ``expected_cells`` lists the heat map's cells and their
classes, as the tests find them.
"""
from __future__ import annotations

import json
import os
import shlex

import jsonschema
import numpy as np

from .certificate import SCHEMA, schema
from .verdict import key

HOSTILE = 'rms_norm:evil<script>alert("id")</script>'
"""A kernel id a page must show as text, never run."""

ENV = {"normcert": "0.1.0", "commit": None, "python": "3.11.7", "torch": "2.13.0+cpu", "triton": "3.7.1",
       "hypothesis": "6.155.2", "numpy": "2.4.6", "device": "cpu", "device_name": "test CPU", "driver": None,
       "profile": "ci", "seed": 0, "bitwise": False, "triton_interpreter": ["bfloat16", "int8"]}


def impl(op: str, backend: str = "plugin", domain: str = "all", certified_on: str = "", configs=()) -> dict:
    return {"op": op, "backend": backend, "target": f"example:{op}", "convention": "out-of-place",
            "expected_failure": "", "domain": domain, "certified_on": certified_on, "configs": list(configs),
            "configs_ran_on": "cpu" if configs else "", "agrees_with": None}


def row(kernel: str, prop: str, dtype: str, outcome: str = "pass", units=0.25, ulps=1.0, message: str = "",
        where: str = "", replay: str = "") -> dict:
    op = kernel.split(":")[0]
    return {"impl": kernel, "op": op, "backend": "plugin", "property": prop, "dtype": dtype, "outcome": outcome,
            "examples": 12, "refused": 0, "domain": "rows <= 64, row length <= 4096", "seconds": 0.5,
            "worst_ulps": ulps, "worst_units": units,
            "worst_where": where or f"y[1, 3]: worst |error| 1e-7 = {units} of bound on {op}(x: {dtype}(4, 8), "
                                    f"seed=17, bucket=odd 3x769)",
            "unclaimed": 0, "message": message, "replay": replay, "modes": "grad on", "threads": 2}


def build(rows: list[dict], impls: dict, verdict: str, not_run=(), scope=None) -> dict:
    """A complete certificate of ``rows``, validated against the schema."""
    summary: dict[str, int] = {}
    for r in rows:
        summary[r["outcome"]] = summary.get(r["outcome"], 0) + 1
    cert = {"run": "complete", "schema": SCHEMA, "verdict": verdict, "disagreement": "",
            "pytest_exit_status": 0 if verdict == "certified" else 1, "deselected": [], "crashed": [],
            "scope": scope or {"properties": "all", "dtypes": "all"}, "not_run": list(not_run),
            "config": {"inifile": None, "rootdir": "/src", "args": ["--pyargs", "normcert.properties"]},
            "environment": dict(ENV), "summary": summary, "implementations": impls, "results": rows}
    jsonschema.validate(cert, schema())
    return cert


def certified() -> dict:
    k = "rms_norm:example:rms_norm"
    rows = [row(k, p, d, units=u) for p, u in (("accuracy", 0.42), ("extremes", 0.003)) for d in ("float32", "bfloat16")]
    rows.append(row(k, "determinism", "float32", units=0.0, ulps=0.0))
    rows.append(row(k, "batch-invariance", "float32", "warn", 0.0, 0.0, message="y: row 0 differs in its bits"))
    return build(rows, {k: impl("rms_norm")}, "certified")


def write_replay(folder: str, values: np.ndarray, suffix: str = "") -> str:
    """A replay file (``replay.py``'s format) holding ``values`` as the float32 input x of rms_norm
    (its name ends in ``suffix``, as a cell's further failures' do)."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    meta = {"format": "normcert-replay/1", "op": "rms_norm", "property": "accuracy", "impl": "rms_norm=example:k",
            "device": "cpu", "versions": {}, "scalars": {"eps": 1e-6}, "params": {}, "notes": {}, "config": "",
            "tensors": {"x": {"dtype": "float32", "shape": list(x.shape), "stride": [s // 4 for s in x.strides],
                              "offset": 0}, "weight": None}}
    path = os.path.join(folder, f"rms_norm-k-accuracy-float32{suffix}.npz")
    np.savez(path, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), t_x=x.view(np.uint8).ravel())
    return path


def failing(folder: str) -> dict:
    """Failures of two kernels, one with a replay file in ``folder``; see the module docstring."""
    a, b = "rms_norm:example:k", HOSTILE
    values = np.linspace(-3, 3, 3 * 40, dtype=np.float32).reshape(3, 40)
    values[1, 7] = 3e4
    replay = "normcert replay " + shlex.quote(write_replay(folder, values))
    rows = [row(a, "accuracy", "float32", "fail", 3.6e7, 1.4e9,
                message="y[1, 7]: got 0.99, exact 0.97, |error| 1e-2 > bound 3e-10", where="rms_norm(x: float32(3, 40), "
                        "seed=4294967295, bucket=odd 3x40)", replay=replay),
            row(a, "accuracy", "float64", units=0.5),
            row(a, "accuracy", "bfloat16", "not-supported", 0.0, 0.0, message="outside its declared domain"),
            row(b, "accuracy", "float32", "error", "nan", "inf", replay="not saved: too large",
                message='ValueError: <script>alert("message")</script> & more'),
            row(b, "accuracy", "float64", "fail", "inf", "inf", message="y[0, 0]: got inf",
                replay="normcert replay /nonexistent/evil.npz"),
            row(b, "gradients", "float32", "not-certified", 0.0, 0.0, message="forward only")]
    not_run = [key({"impl": a, "property": "gradients", "dtype": "float32"}),
               key({"impl": b, "property": "accuracy", "dtype": "float16"})]
    impls = {a: impl("rms_norm", domain="dtypes=float32,float64", certified_on="dtypes float32, float64"),
             b: impl("rms_norm", configs=("BLOCK=128", "BLOCK=256"))}
    return build(rows, impls, "not certified", not_run)


def expected_cells(cert: dict) -> dict[str, str]:
    """data-cell "kernel|property|dtype" -> the outcome class its heat map cell must carry."""
    cells = {"|".join((r["impl"], r["property"], r["dtype"])): r["outcome"] for r in cert["results"]}
    for entry in cert["not_run"]:
        cells["|".join(entry.rsplit(" ", 2))] = "not-run"
    return cells
