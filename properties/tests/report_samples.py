"""For the report's tests: small certificates built by hand, each held to the published schema.

``certified()`` is one kernel that passes everything, with a warning; ``failing(folder)`` is two
kernels with failures (one with replay files written in ``folder`` in the replay format, one with
an exception and non-finite numbers), a kernel not certified on float64, a hostile kernel id and
message, and checks that did not run.  The replay files' per-element data is measured as a run
measures it: ``off_kernel`` checks an rms_norm output that is off at two elements against the
oracle (``measure.check_against_oracle``), ``disagreeing`` compares two outputs as ``--agree``
does (``families.agreement.disagreement``).  ``expected_cells`` lists the heat map's cells and their
classes, as the tests find them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex

import jsonschema
import numpy as np
import torch

from ... import oracle
from ..search.case import Case
from ..evidence.certificate import SCHEMA, finite_json, schema
from ..families.agreement import disagreement
from ..harness.measure import PropertyFailure, Worst, check_against_oracle
from ..evidence.verdict import key

HOSTILE = 'rms_norm:evil<script>alert("id")</script>'
"""A kernel id a page must show as text, never run."""

ENV = {"normcert": "0.1.0", "commit": None, "python": "3.11.7", "torch": "2.13.0+cpu", "triton": "3.7.1",
       "hypothesis": "6.155.2", "numpy": "2.4.6", "device": "cpu", "device_name": "test CPU", "driver": None,
       "profile": "ci", "seed": 0, "bitwise": False, "triton_interpreter": ["bfloat16", "int8"]}


def impl(op: str, backend: str = "plugin", domain: str = "all", certified_on: str = "", configs=()) -> dict:
    return {"op": op, "backend": backend, "target": f"example:{op}", "convention": "out-of-place",
            "expected_failure": "", "domain": domain, "certified_on": certified_on, "configs": list(configs),
            "configs_ran_on": "cpu" if configs else "", "agrees_with": None,
            "code": code({"example": "kernel source v1", "example_helpers": "helpers v1"})}


def code(sources: dict[str, str]) -> dict:
    """The ``code`` record (``evidence.code``) of modules holding ``sources`` (module name -> text)."""
    files = {m: hashlib.sha256(text.encode()).hexdigest() for m, text in sorted(sources.items())}
    lines = "".join(f"{files[m]}  {m}\n" for m in sorted(files))
    return {"digest": hashlib.sha256(lines.encode()).hexdigest(), "files": files, "within": "folder of example.py",
            "distribution": None}


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
    return validate(cert)


def validate(cert: dict) -> dict:
    """``cert``, held to the certificate's JSON Schema."""
    jsonschema.validate(cert, schema())
    return cert


def certified() -> dict:
    k = "rms_norm:example:rms_norm"
    rows = [row(k, p, d, units=u) for p, u in (("accuracy", 0.42), ("extremes", 0.003)) for d in ("float32", "bfloat16")]
    rows.append(row(k, "determinism", "float32", units=0.0, ulps=0.0))
    rows.append(row(k, "batch-invariance", "float32", "warn", 0.0, 0.0, message="y: row 0 differs in its bits"))
    return build(rows, {k: impl("rms_norm")}, "certified")


def write_replay(folder: str, values: np.ndarray, elements: dict | None = None, prop: str = "accuracy",
                 agrees_with: str | None = None, suffix: str = "") -> str:
    """A replay file (``replay.py``'s format) holding ``values`` as the float32 input x of rms_norm,
    with the failing output's per-element data ``elements`` where given (its name ends in ``suffix``,
    as a cell's further failures' do)."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    meta = {"format": "normcert-replay/1", "op": "rms_norm", "property": prop, "impl": "rms_norm=example:k",
            **({"agrees_with": agrees_with} if agrees_with else {}),
            "device": "cpu", "versions": {}, "scalars": {"eps": 1e-6}, "params": {}, "notes": {}, "config": "",
            "tensors": {"x": {"dtype": "float32", "shape": list(x.shape), "stride": [s // 4 for s in x.strides],
                              "offset": 0}, "weight": None}}
    if elements is not None:
        meta["elements"] = finite_json(elements)
    path = os.path.join(folder, f"rms_norm-k-{prop}-float32{suffix}.npz")
    np.savez(path, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), t_x=x.view(np.uint8).ravel())
    return path


def sample_case(values: np.ndarray) -> tuple[Case, torch.Tensor]:
    """(the rms_norm case of input ``values``, its exact output rounded to float32)."""
    case = Case("rms_norm", {"x": torch.from_numpy(np.asarray(values, dtype=np.float32)), "weight": None}, {"eps": 1e-6})
    return case, torch.from_numpy(oracle.forward("rms_norm", **case.oracle_args())[0]).to(torch.float32)


def off_kernel(values: np.ndarray) -> tuple[str, dict, float, float]:
    """An rms_norm output of ``values`` off at y[1, 7] (1% high) and y[1, 30] (64 float32 ulps) checked
    against the oracle: (its failure's message, per-element data, worst error / bound and ulps)."""
    case, y = sample_case(values)
    y[1, 7] *= 1.01
    y[1, 30] = float(y[1, 30]) + 64 * float(np.spacing(np.float32(y[1, 30])))
    worst = Worst()
    try:
        check_against_oracle((y,), case, worst)
    except PropertyFailure as e:
        return str(e), case.elements, worst.units, worst.ulps
    raise AssertionError("the planted output passed")


def disagreeing(values: np.ndarray) -> tuple[str, dict]:
    """Two rms_norm outputs of ``values`` that differ at y[0, 5] (3 float32 ulps) and y[2, 0] (-0 and +0),
    compared as ``--agree`` compares them: (a message as its check words it, the per-element data)."""
    _, mine = sample_case(values)
    theirs = mine.clone()
    theirs[0, 5] = float(np.nextafter(np.nextafter(np.nextafter(np.float32(mine[0, 5]), np.inf), np.inf), np.inf))
    mine[2, 0], theirs[2, 0] = -0.0, 0.0
    differ = (mine.view(torch.int32) != theirs.view(torch.int32)).numpy()
    message = (f"y[0, 5]: rms_norm:example:k gives {float(mine[0, 5]):.9g} and rms_norm:example:twin gives "
               f"{float(theirs[0, 5]):.9g}; {int(differ.sum())} of {differ.size} elements differ in their bits")
    return message, disagreement("y", mine, theirs, differ, (0, 5))


def failing(folder: str) -> dict:
    """Failures of two kernels, with replay files in ``folder``; see the module docstring."""
    a, b = "rms_norm:example:k", HOSTILE
    values = np.linspace(-3, 3, 3 * 40, dtype=np.float32).reshape(3, 40)
    values[1, 7] = 3e4
    message, elements, units, ulps = off_kernel(values)
    replay = "normcert replay " + shlex.quote(write_replay(folder, values, elements))
    differ, apart = disagreeing(values)
    agree = "normcert replay " + shlex.quote(write_replay(folder, values, apart, "agreement", "rms_norm=example:twin"))
    rows = [row(a, "accuracy", "float32", "fail", units, ulps, message=message,
                where="rms_norm(x: float32(3, 40), seed=4294967295, bucket=odd 3x40)", replay=replay),
            row(a, "accuracy", "float64", units=0.5),
            row(a, "accuracy", "bfloat16", "not-supported", 0.0, 0.0, message="outside its declared domain"),
            row(a, "agreement", "float32", "fail", 0.0, 0.0, message=differ, where="rms_norm(x: float32(3, 40), "
                "seed=7, bucket=odd 3x40)", replay=agree),
            row(b, "accuracy", "float32", "error", "nan", "inf", replay="not saved: too large",
                message='ValueError: <script>alert("message")</script> & more'),
            row(b, "accuracy", "float64", "fail", "inf", "inf", message="y[0, 0]: got inf",
                replay="normcert replay /nonexistent/evil.npz"),
            row(b, "gradients", "float32", "not-certified", 0.0, 0.0, message="forward only")]
    not_run = [key({"impl": a, "property": "gradients", "dtype": "float32"}),
               key({"impl": b, "property": "accuracy", "dtype": "float16"})]
    impls = {a: {**impl("rms_norm", domain="dtypes=float32,float64", certified_on="dtypes float32, float64"),
                 "agrees_with": "rms_norm:example:twin"},
             b: impl("rms_norm", configs=("BLOCK=128", "BLOCK=256"))}
    return build(rows, impls, "not certified", not_run)


def expected_cells(cert: dict) -> dict[str, str]:
    """data-cell "kernel|property|dtype" -> the outcome class its heat map cell must carry."""
    cells = {"|".join((r["impl"], r["property"], r["dtype"])): r["outcome"] for r in cert["results"]}
    for entry in cert["not_run"]:
        cells["|".join(entry.rsplit(" ", 2))] = "not-run"
    return cells
