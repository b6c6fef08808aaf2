"""The certificate: what was checked, on what, and the worst error seen.

JSON schema ``normcert-certificate/1`` (documented in the README):

    {"schema": "normcert-certificate/1",
     "environment": {"normcert" (version), "commit" (normcert's own git describe, null for a wheel), "python", "torch", "triton", "hypothesis", "numpy",
                     "device", "device_name", "driver", "profile", "seed", "bitwise"},
     "summary": {"pass": n, "fail": n, "not-supported": n, "expected-fail": n, "warn": n},
     "results": [{"impl", "op", "backend", "property", "dtype", "outcome", "examples", "seconds",
                  "worst_ulps", "worst_units", "worst_where", "unclaimed", "message", "replay"}]}

``worst_units`` is error / bound of the error model (<= 1 passes); ``worst_ulps``
is in ulps of the output dtype; ``worst_where`` names the element and the case.
The Markdown beside it renders the same data as tables.
"""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest

import normcert

SCHEMA = "normcert-certificate/1"
CORE = ("accuracy", "extremes", "contract", "gradients")


def check_writable(path: str) -> None:
    """Fail early, in one line, if the certificate cannot be written."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise pytest.UsageError(f"--certificate {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise pytest.UsageError(f"--certificate {path}: not writable")


def unexpected_passes(results: list[dict]) -> list[str]:
    """Case studies that ran their core properties and failed none of them."""
    by_impl: dict[str, list[dict]] = {}
    for r in results:
        if r["backend"] == "case-study":
            by_impl.setdefault(r["impl"], []).append(r)
    bad = []
    for impl, rs in by_impl.items():
        ran = {r["prop"] for r in rs}
        if set(CORE) <= ran and not any(r["outcome"] in ("expected-fail", "fail") for r in rs):
            bad.append(impl)
    return bad


def environment(config) -> dict:
    import torch  # noqa: PLC0415

    from normcert.properties.harness import CONFIG  # noqa: PLC0415
    from normcert.properties.replay import versions  # noqa: PLC0415

    device = CONFIG["device"]
    cuda = device == "cuda" and torch.cuda.is_available()
    env = {"normcert": normcert.__version__, "commit": normcert.source_revision(), **versions(), "device": device,
           "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
           "driver": torch.version.cuda if cuda else None,
           "profile": config.getoption("hypothesis_profile", None) or "ci",
           "seed": CONFIG["seed"], "bitwise": CONFIG["bitwise"]}
    return env


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def build(results: list[dict], config) -> dict:
    rows = [{"impl": r["impl"], "op": r["op"], "backend": r["backend"], "property": r["prop"], "dtype": r["dtype"],
             "outcome": r["outcome"], "examples": r["examples"], "seconds": round(r["seconds"], 3),
             "worst_ulps": r["worst_ulps"], "worst_units": r["worst_units"], "worst_where": r["worst_where"],
             "unclaimed": r["unclaimed"], "message": r["message"], "replay": r["replay"]} for r in results]
    from normcert.properties.harness import CONFIG  # noqa: PLC0415

    impls = {i.id: {"op": i.op, "backend": i.backend, "target": i.target, "expected_failure": i.expected_failure}
             for i in CONFIG.get("impls", ())}
    return {"schema": SCHEMA, "environment": environment(config), "summary": dict(Counter(r["outcome"] for r in rows)),
            "implementations": impls, "results": rows}


def markdown(cert: dict) -> str:
    env = cert["environment"]
    lines = ["# normcert certificate", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    lines += ["", "Summary: " + ", ".join(f"{v} {k}" for k, v in sorted(cert["summary"].items())), ""]
    lines += ["| implementation | property | dtype | outcome | examples | worst ulp | worst error/bound |",
              "|---|---|---|---|---|---|---|"]
    for r in sorted(cert["results"], key=lambda r: (r["impl"], r["property"], r["dtype"])):
        lines.append(f"| {r['impl']} ({r['backend']}) | {r['property']} | {r['dtype']} | {r['outcome']} | "
                     f"{r['examples']} | {r['worst_ulps']:.3g} | {r['worst_units']:.3g} |")
    lines += case_studies(cert)
    failures = [r for r in cert["results"] if r["outcome"] in ("fail", "expected-fail", "warn")]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            lines += [f"- **{r['impl']}** {r['property']} {r['dtype']} ({r['outcome']}): {r['message']}",
                      f"  - case: `{r['worst_where']}`", f"  - replay: `{r['replay']}`"]
    return "\n".join(lines) + "\n"


FIRST = ("accuracy", "contract", "extremes", "fusion", "padding", "row-independence", "invariance", "gradients",
         "gradcheck", "determinism", "batch-invariance")  # which failure a verdict names first


def case_studies(cert: dict) -> list[str]:
    """The verdict on each case study: per dtype, the first property that rejected it, what the
    suite saw and the shrunk case; the design's registered reason stands on its first row."""
    by_impl: dict[str, list[dict]] = {}
    for r in cert["results"]:
        if r["backend"] == "case-study":
            by_impl.setdefault(r["impl"], []).append(r)
    if not by_impl:
        return []
    lines = ["", "## Case studies", "",
             "| design: why it must fail (registered) | dtype | rejected first by | what the suite saw | shrunk case |",
             "|---|---|---|---|---|"]
    cell = lambda text, k: text[:k].replace("|", "\\|")  # noqa: E731
    for impl in sorted(by_impl):
        failed = [r for r in by_impl[impl] if r["outcome"] in ("expected-fail", "fail")]
        why = cert.get("implementations", {}).get(impl, {}).get("expected_failure", "")
        head = f"**{impl}**: {cell(why, 300)}"
        if not failed:
            lines.append(f"| {head} | all | **not rejected** | - | - |")
            continue
        for dtype in ("float64", "float32", "float16", "bfloat16"):
            rs = sorted((r for r in failed if r["dtype"] == dtype),
                        key=lambda r: FIRST.index(r["property"]) if r["property"] in FIRST else len(FIRST))
            if rs:
                r = rs[0]
                others = len(rs) - 1
                by = r["property"] + (f" (+{others} more)" if others else "")
                lines.append(f"| {head} | {dtype} | {by} | {cell(r['message'], 180)} | `{cell(r['worst_where'], 140)}` |")
                head = ""
    return lines


def write(path: str, results: list[dict], config) -> None:
    cert = build(results, config)
    md = os.path.splitext(path)[0] + ".md"
    for target, text in ((path, json.dumps(cert, indent=1)), (md, markdown(cert))):
        tmp = target + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, target)  # never leave a half-written certificate behind
