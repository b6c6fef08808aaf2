"""The certificate: what was checked, on what, and the worst error seen.

JSON schema ``normcert-certificate/10`` (``normcert-certificate.schema.json`` beside this file, printed by
``normcert schema``; documented in docs/reference/certificate.md):

    {"run": "complete" | "incomplete: ..." | "interrupted" | "stopped early: ..." (always the first line),
            with ", but then <what>" added by ``normcert certify``'s parent where the kernel's process
            did not end as its run said (kept alive past the kernel timeout, another exit status),
     "schema": "normcert-certificate/10",
     "verdict": "certified" | "not certified" | "incomplete" (``verdict.judge``: from the result rows)
                | "shard passed" (a shard's run whose own checks all pass: never "certified"),
     "shard": null, or {"index" K, "count" N, "checks" [its checks], "total" (the run's), "identity"
              (SHA-256 of the run's checks)} for a run of ``--shard K/N`` (``shards``),
     "merged_from": [{"file", "shard" "K/N"}] (``normcert merge``'s certificate only),
     "disagreement": "" or how pytest's exit status and the result rows disagree (a plugin changed reports),
     "pytest_exit_status": int or null, "deselected": [node ids], "crashed": [node ids],
     "scope": {"properties": [names] or "all", "dtypes": [names] or "all"} (the run's declared scope),
     "not_run": ["kernel id property dtype", ...] (checks of the scope that left no result),
     "config": {"inifile", "rootdir", "args"} (the pytest configuration the run was made under),
     "environment": {"normcert" (version), "commit" (normcert's own git describe, null for a wheel), "python", "torch", "triton", "hypothesis", "numpy",
                     "device", "device_name", "driver", "profile", "seed", "bitwise",
                     "triton_interpreter" (null on a GPU, else the corrections made: properties.harness.interpreter)},
     "summary": {"pass": n, "fail": n, "not-supported": n, "not-certified": n, "expected-fail": n, "warn": n,
                 "not-run": n (a check whose cases held 0 elements)},
     "implementations": {kernel id: {"op", "backend", "target", "convention", "expected_failure",
                                     "domain" (its declared domain as ``--domain`` reads it, or "all"),
                                     "certified_on" (the same in words, "" for all),
                                     "configs" (an autotuned kernel's configs, each checked by every
                                     property; [] if none), "configs_ran_on",
                                     "agrees_with" (the kernel id it must give the bits of, --agree; null),
                                     "code" (the code certified, ``code.record``: {"digest", "files"
                                     {module: sha256}, "within", "distribution" {"name", "version"} or null}),
                                     "triton" (which of its modules' @triton.jit functions ran, at which
                                     constexpr and launch values, and which the run never reached,
                                     ``coverage.record``: {"ran", "not_reached"}; null for no Triton kernel)}},
     "results": [{"impl", "op", "backend", "property", "dtype", "outcome", "examples", "refused", "domain",
                  "seconds", "worst_ulps", "worst_units", "worst_where", "unclaimed", "message", "replay",
                  "modes" (how the kernel was called: "grad on", the served family's modes and why
                  others did not run, or, for a family that draws the calling context, the count of
                  checked cases per value of each field drawn: "contexts: grad on 9, no_grad 2; ..."),
                  "threads" (torch's intra-op threads when the result was recorded),
                  "calls" (the calls in a row of the served family's long run on one case,
                  ``families.long_run``; 0 where none ran),
                  "launches" (the Triton launches the check made, ``harness.launches``: {"module:function":
                  {"launches", "meta"}}; absent where it made none),
                  "failures" (a failing row only: each distinct failure its search found, the first being
                  the one "message", "worst_where" and "replay" name: [{"message", "where", "kind",
                  "replay", "worst_units", "worst_ulps" (the last two where a measurement failed)}])}]}

"certified" follows from the result rows (``verdict.judge``): none fails, every (kernel, property,
dtype) of the scope has one (``families.expected``), no xdist worker crashed, and pytest exited 0;
a run narrowed by ``-k``, ``-m``, ``--co`` or anything else that keeps a check from running lists
it in ``not_run`` and is not certified.  The ``normcert`` command's parent process judges the rows
again from the run record and corrects a certificate that says otherwise (``normcert.cli``).
A kernel with a declared domain (``properties.declared.domain``) is certified on that domain only: the
headline says "certified on: <its restrictions>".

The JSON is standard (no ``Infinity`` / ``NaN`` literals): a non-finite number
is written as the string "inf", "-inf" or "nan".  An ``incomplete`` certificate
is written before the first test runs and replaced when the run ends, so a run
that crashed or was killed never leaves a stale or all-pass certificate.

``worst_units`` is error / bound of the error model (<= 1 passes); ``worst_ulps``
is in ulps of the output dtype; ``worst_where`` names the element and the case.
The Markdown beside it renders the same data as tables.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
from collections import Counter

import normcert

from . import coverage
from .code import short
from .files import UnsafePath, why_not_writable, write_atomic
from ..harness.run_settings import PROFILES
from .verdict import DTYPE_ORDER


def _usage(message: str) -> Exception:
    """pytest's usage error (exit status 4), imported here only: ``normcert certify``'s own process reads
    and writes certificates without pytest (0.2 s at the end of every run)."""
    import pytest  # noqa: PLC0415

    return pytest.UsageError(message)

SCHEMA = "normcert-certificate/10"
READABLE = ("normcert-certificate/7", "normcert-certificate/8", "normcert-certificate/9", SCHEMA)
"""The certificate formats ``normcert report``, ``compare`` and ``merge`` read: every older certificate
is a /10 one but for its name (/8 added the outcome "not-run", /9 the optional ``shard`` and the
verdict "shard passed", /10 each implementation's ``code`` and the run state "..., but then ..."),
so all are held to this schema; one without ``code`` names no code, and ``merge`` refuses it."""


def schema() -> dict:
    """The certificate's JSON Schema (``normcert-certificate.schema.json``): its ``$id`` is ``SCHEMA``."""
    with open(os.path.join(os.path.dirname(__file__), "normcert-certificate.schema.json")) as f:
        return json.load(f)


def check_writable(path: str, flag: str = "--certificate") -> None:
    """Fail early, in one line naming the option ``flag``, if the certificate (JSON, and the Markdown
    and badge beside it) may not be written (``files.why_not_writable``)."""
    problem = why_not_written(path)
    if problem:
        raise _usage(f"{flag} {path}: {problem}")


def why_not_written(path: str, taken: dict[str, str] | None = None) -> str:
    """Why the certificate's three files may not be written at ``path`` ("" where they may), naming
    the file refused; ``taken`` as for ``files.why_not_writable``.  A path ending in .md (any case)
    is refused: the Markdown written beside the JSON would be the JSON's own path."""
    if path.lower().endswith(".md"):
        return "give the JSON path; the Markdown is written beside it as .md"
    for target, kind in own_files(path):
        problem = why_not_writable(target, kind, taken)
        if problem:
            return f"{target} {problem}"
    return ""


def check_failures_dir(path: str, flag: str = "--failures-dir") -> None:
    """The failures folder (option ``flag``) must be a folder that exists and is writable, or can be created."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise _usage(f"{flag} {path}: is a file, expected a folder")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise _usage(f"{flag} {path}: {existing} is not a writable folder")


def markdown_path(path: str) -> str:
    return os.path.splitext(path)[0] + ".md"


def unexpected_passes(results: list[dict]) -> list[str]:
    """Case studies that ran their core properties and failed none of them."""
    from ..families import FAMILIES  # noqa: PLC0415 - torch only once results exist

    core = {f.name for f in FAMILIES if f.core}
    by_impl: dict[str, list[dict]] = {}
    for r in results:
        if r["backend"] == "case-study":
            by_impl.setdefault(r["impl"], []).append(r)
    bad = []
    for impl, rs in by_impl.items():
        ran = {r["prop"] for r in rs}
        if core <= ran and not any(r["outcome"] in ("expected-fail", "fail") for r in rs):
            bad.append(impl)
    return bad


def versions() -> dict:
    """The versions a certificate's environment and a replay file record."""
    import hypothesis  # noqa: PLC0415 - this module imports no torch: usage errors come fast
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    out = {"python": platform.python_version(), "torch": torch.__version__, "hypothesis": hypothesis.__version__,
           "numpy": np.__version__}
    try:
        import triton  # noqa: PLC0415

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


def environment(session, config) -> dict:
    import torch  # noqa: PLC0415

    device = session.device
    cuda = device == "cuda" and torch.cuda.is_available()
    env = {"normcert": normcert.__version__, "commit": normcert.source_revision(), **versions(), "device": device,
           "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
           "driver": torch.version.cuda if cuda else None,
           "profile": config.getoption("hypothesis_profile", None) or "ci",
           "seed": session.seed, "bitwise": session.bitwise, "triton_interpreter": session.interpreter}
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


def _row(r: dict) -> dict:
    return {"impl": r["impl"], "op": r["op"], "backend": r["backend"], "property": r["prop"], "dtype": r["dtype"],
            "outcome": r["outcome"], "examples": r["examples"], "refused": r["refused"], "domain": r["domain"],
            "seconds": round(r["seconds"], 3), "worst_ulps": r["worst_ulps"], "worst_units": r["worst_units"],
            "worst_where": r["worst_where"], "unclaimed": r["unclaimed"], "message": r["message"],
            "replay": r["replay"], "modes": r.get("modes", ""), "threads": r.get("threads", 0),
            "calls": r.get("calls", 0),
            **({"launches": r["launches"]} if r.get("launches") else {}),
            **({"failures": r["failures"]} if r.get("failures") else {})}


def _configs(session, impl) -> dict:
    """An autotuned kernel's configs, each run under every property (``properties.harness.autotune``), and where:
    under Triton's interpreter a config is its kwargs alone (num_warps, num_stages, num_ctas and
    maxnreg are not run there, so none is claimed)."""
    forcing = session.forcing(impl)
    if not forcing.names:
        return {"configs": [], "configs_ran_on": ""}
    where = ("Triton's interpreter (kwargs only: num_warps, num_stages, num_ctas, maxnreg not checked)"
             if forcing.interpreted else session.device)
    return {"configs": list(forcing.names), "configs_ran_on": where}


def implementations(session, code: dict[str, dict], rows: list[dict] = ()) -> dict:
    """The certificate's ``implementations``: each kernel the run checks on its device (one
    registered for another, e.g. the compiled kernels on CPU, is not run there, so not listed),
    with ``code``'s record of the code it runs (``evidence.code``; null where none was read) and
    which of its modules' Triton functions the result ``rows`` reached (``evidence.coverage``)."""
    return {i.id: {"op": i.op, "backend": i.backend, "target": i.target, "convention": i.convention or "out-of-place",
                   "expected_failure": i.expected_failure, "domain": i.domain.spec() or "all",
                   "certified_on": i.domain.describe(), **_configs(session, i),
                   "agrees_with": i.agrees_with.id if i.agrees_with is not None else None,
                   "code": code.get(i.id),
                   "triton": coverage.record(i.id, rows, (code.get(i.id) or {}).get("files", ()))}
            for i in session.impls if session.device in i.devices}


def build(session, results: list[dict], config, run: dict, code: dict[str, dict]) -> dict:
    """The certificate of ``session``'s run; ``results`` as gathered from every worker;
    ``run`` = {"run", "verdict", "pytest_exit_status", "deselected", "crashed", "scope", "not_run"};
    ``code``: kernel id -> the code it runs (``evidence.code.of``)."""
    rows = [_row(r) for r in results]
    impls = implementations(session, code, rows)
    return {"run": run["run"], "schema": SCHEMA, "verdict": run["verdict"], "disagreement": run["disagreement"],
            "pytest_exit_status": run["pytest_exit_status"], "deselected": run["deselected"],
            "crashed": run["crashed"], "scope": run["scope"], "not_run": run["not_run"], "shard": run.get("shard"),
            "config": {"inifile": str(config.inipath) if config.inipath else None, "rootdir": str(config.rootpath),
                       "args": list(config.invocation_params.args)},
            "environment": environment(session, config),
            "summary": dict(Counter(r["outcome"] for r in rows)), "implementations": impls, "results": rows}


def finite_json(value):
    """``value`` with every non-finite float replaced by "inf", "-inf" or "nan" (standard JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def to_json(cert: dict) -> str:
    """Standard JSON whose first line carries the run's state: ``{"run": "...",``."""
    text = json.dumps(finite_json(cert), indent=1, allow_nan=False)
    return "{" + text[1:].lstrip()


def md(text, limit: int | None = None) -> str:
    """``text`` (a kernel's message or exception class name, a kernel id: anything a kernel or its
    module sets) as inert Markdown on one line, cut to ``limit`` characters first: line breaks become
    spaces, ``& < >`` HTML entities (no tag, no image, no heading reaches a viewer), and
    ``\\ ` * _ ~ [ ] |`` escaped with a backslash (no emphasis, link, code span or table cell)."""
    s = " ".join(str(text).splitlines())[:limit]
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_~\[\]|])", r"\\\1", s)


def code(text, limit: int | None = None) -> str:
    """``text`` as the inside of a Markdown code span: one line, no backtick (which would end it)."""
    return " ".join(str(text).splitlines())[:limit].replace("`", "'")


def markdown(cert: dict) -> str:
    env = cert["environment"]
    lines = [f"# normcert certificate: {headline(cert)}", "",
             f"pytest exit status: {cert['pytest_exit_status']}; deselected tests: {len(cert['deselected'])}; "
             f"crashed tests: {', '.join(cert['crashed']) or 'none'}; checks that did not run: {len(cert['not_run'])}"
             + (f" ({', '.join(cert['not_run'][:5])}{', ...' if len(cert['not_run']) > 5 else ''})"
                if cert["not_run"] else ""), ""]
    if cert.get("disagreement"):
        lines += [f"**The run's reports and its results disagree:** {md(cert['disagreement'])}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {md(k)} | {md(v)} |" for k, v in env.items()]
    lines += ["", "| code certified | |", "|---|---|"]
    lines += [f"| {md(k)} | {md(short(v.get('code')))} |" for k, v in sorted(cert["implementations"].items())]
    reached = [(k, coverage.describe(v["triton"])) for k, v in sorted(cert["implementations"].items()) if v.get("triton")]
    if reached:
        lines += ["", "| Triton paths | |", "|---|---|"] + [f"| {md(k)} | {md(text)} |" for k, text in reached]
    lines += ["", "Summary: " + ", ".join(f"{v} {k}" for k, v in sorted(cert["summary"].items())), ""]
    lines += ["| implementation | property | dtype | outcome | examples | worst ulp | worst error/bound | domain | "
              "modes | threads | calls in a row |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    num = lambda v: v if isinstance(v, str) else f"{v:.3g}"  # noqa: E731 - "inf" arrives as a string
    for r in sorted(cert["results"], key=lambda r: (r["impl"], r["property"], r["dtype"])):
        lines.append(f"| {r['impl']} ({r['backend']}) | {r['property']} | {r['dtype']} | {r['outcome']} | "
                     f"{r['examples']} | {num(r['worst_ulps'])} | {num(r['worst_units'])} | {r['domain']} | "
                     f"{r.get('modes', '')} | {r.get('threads', '')} | {r.get('calls') or ''} |")
    lines += case_studies(cert)
    failures = [r for r in cert["results"] if r["outcome"] in ("fail", "error", "expected-fail", "warn")]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            lines += [f"- **{r['impl']}** {r['property']} {r['dtype']} ({r['outcome']}): {md(r['message'])}",
                      f"  - case: `{code(r['worst_where'])}`", f"  - replay: `{code(r['replay'])}`"]
            for k, f in enumerate(r.get("failures", [])[1:], 2):
                lines += [f"  - failure {k} of {len(r['failures'])}, another kind ({md(f['kind'])}): {md(f['message'])}",
                          f"    - case: `{code(f['where'])}`", f"    - replay: `{code(f['replay'])}`"]
    return "\n".join(lines) + "\n"


def headline(cert: dict) -> str:
    """The certificate's verdict in one line (``verdict_line``)."""
    domains = claimed({k: v.get("certified_on", "") for k, v in cert["implementations"].items()}, cert["results"])
    return verdict_line(cert["verdict"], domains, cert["scope"], cert["run"],
                        cert.get("environment", {}).get("profile"), cert.get("shard"))


DECLARED_OUT = "outside its declared domain"  # the message of a dtype the kernel's domain leaves out (runner)


def claimed(domains: dict[str, str], rows: list[dict]) -> dict[str, str]:
    """Each kernel's declared domain in words, with the dtypes it refused without declaring them
    added: a kernel certified on float32 alone says so in the headline whether it declared
    ``dtypes=float32`` or raised NotImplementedError on the others; and so do the properties it was
    not certified on (``not-certified`` rows: a forward-only kernel's gradients)."""
    refused: dict[str, list[str]] = {}
    partly: dict[str, dict[str, list[str]]] = {}  # kernel -> dtype -> the properties it refused there
    for (impl, dtype), props in _refusals(rows).items():
        if props is None:
            refused.setdefault(impl, []).append(dtype)
        else:
            partly.setdefault(impl, {})[dtype] = props
    uncertified: dict[str, list[str]] = {}
    for r in rows:
        prop = r.get("property", r.get("prop"))  # a certificate's row, or a run record's
        if r["outcome"] == "not-certified" and prop not in uncertified.setdefault(r["impl"], []):
            uncertified[r["impl"]].append(prop)
    out = dict(domains)
    for impl, dtypes in refused.items():
        words = "refuses (undeclared) dtypes " + ", ".join(d for d in DTYPE_ORDER if d in dtypes)
        out[impl] = f"{out[impl]}; {words}" if out.get(impl) else words
    for impl, by in partly.items():
        words = "; ".join(f"{', '.join(props)} refused (undeclared) in {d}" for d, props in
                          sorted(by.items(), key=lambda kv: DTYPE_ORDER.index(kv[0]) if kv[0] in DTYPE_ORDER else 99))
        out[impl] = f"{out[impl]}; {words}" if out.get(impl) else words
    for impl, props in uncertified.items():
        if props:
            words = f"{', '.join(props)} not certified (forward only, or not run here)"
            out[impl] = f"{out[impl]}; {words}" if out.get(impl) else words
    return out



def _refusals(rows: list[dict]) -> dict[tuple[str, str], list[str] | None]:
    """(kernel, dtype) -> None where every row of the kernel in that dtype is an undeclared refusal
    (the kernel refuses the dtype), else the properties refused there while its other rows ran (a
    gradcheck refused under no_grad beside float64 rows that passed); only pairs with a refusal."""
    props: dict[tuple[str, str], list[str]] = {}
    ran: set[tuple[str, str]] = set()
    for r in rows:
        key = (r["impl"], r["dtype"])
        if r["outcome"] == "not-supported" and not str(r.get("message", "")).startswith(DECLARED_OUT):
            props.setdefault(key, []).append(r.get("property", r.get("prop")))
        elif r["outcome"] != "not-supported":
            ran.add(key)
    return {key: (sorted(set(p)) if key in ran else None) for key, p in props.items()}


def verdict_line(verdict: str, domains: dict[str, str], scope: dict, state: str, profile: str | None = None,
                 shard: dict | None = None) -> str:
    """The verdict in one line, as the certificate's first line and ``normcert certify``'s last say it:
    with the kernels' declared domains, the declared scope where the run was narrowed, a Hypothesis
    profile with fewer examples than ``ci``'s, the run's state where it did not complete, and, for a
    shard's run (``shards.record``), which shard and that it is no certificate of the whole."""
    text = verdict + on_domains(domains)
    if shard:
        text = (f"shard {shard['index']}/{shard['count']} passed: its {len(shard['checks'])} of the run's "
                f"{shard['total']} checks pass (not certified until merged with the other shards: normcert merge)"
                if verdict == "shard passed" else f"{text} (shard {shard['index']}/{shard['count']})")
    narrowed = [f"{k} {', '.join(v)}" for k, v in scope.items() if v != "all"]
    if narrowed:
        text += f" (scope: {'; '.join(narrowed)})"
    if profile in PROFILES and PROFILES[profile] < PROFILES["ci"]:
        text += f" (profile {profile}: {PROFILES[profile]} examples a property, fewer than ci's {PROFILES['ci']})"
    return text if state == "complete" else f"{text} -- run {state}"


def on_domains(domains: dict[str, str]) -> str:
    """" on: <restrictions>" for the kernels that declared a domain (named where there are several)."""
    declared = {k: v for k, v in domains.items() if v}
    if not declared:
        return ""
    if len(domains) == 1:
        return f" on: {next(iter(declared.values()))}"
    return " on declared domains: " + "; ".join(f"{k}: {v}" for k, v in sorted(declared.items()))


def case_studies(cert: dict) -> list[str]:
    """The verdict on each case study: per dtype, the first property that rejected it, what the
    suite saw and the shrunk case; the design's registered reason stands on its first row."""
    from ..families import FAMILIES  # noqa: PLC0415

    first = [f.name for f in FAMILIES]  # which failure a verdict names first
    by_impl: dict[str, list[dict]] = {}
    for r in cert["results"]:
        if r["backend"] == "case-study":
            by_impl.setdefault(r["impl"], []).append(r)
    if not by_impl:
        return []
    lines = ["", "## Case studies", "",
             "| design: why it must fail (registered) | dtype | rejected first by | what the suite saw | shrunk case |",
             "|---|---|---|---|---|"]
    for impl in sorted(by_impl):
        failed = [r for r in by_impl[impl] if r["outcome"] in ("expected-fail", "fail", "error")]
        why = cert.get("implementations", {}).get(impl, {}).get("expected_failure", "")
        head = f"**{impl}**: {md(why, 300)}"
        if not failed:
            lines.append(f"| {head} | all | **not rejected** | - | - |")
            continue
        for dtype in DTYPE_ORDER:
            rs = sorted((r for r in failed if r["dtype"] == dtype),
                        key=lambda r: first.index(r["property"]) if r["property"] in first else len(first))
            if rs:
                r = rs[0]
                others = len(rs) - 1
                by = r["property"] + (f" (+{others} more)" if others else "")
                lines.append(f"| {head} | {dtype} | {by} | {md(r['message'], 180)} | `{code(r['worst_where'], 140)}` |")
                head = ""
    return lines


def write(path: str, session, results: list[dict], config, run: dict, code: dict[str, dict]) -> dict:
    """Write the certificate of the run (JSON, Markdown, badge); returns it."""
    cert = finite_json(build(session, results, config, run, code))
    write_files(path, cert)
    return cert


def write_incomplete(path: str, why: str) -> None:
    """The certificate of a run that has not finished (or ended without normcert's end-of-run step):
    written before any kernel code is imported, replaced by ``write`` when the run ends."""
    write_files(path, {"run": f"incomplete: {why}", "schema": SCHEMA, "verdict": "incomplete", "disagreement": "",
                    "pytest_exit_status": None, "deselected": [], "crashed": [], "scope": {}, "not_run": [],
                    "shard": None,
                    "config": {}, "environment": {"normcert": normcert.__version__}, "summary": {},
                    "implementations": {}, "results": []})


def refused(path: str | None, why: str) -> Exception:
    """The usage error ``why`` that stopped a run before any check, its certificate at ``path`` (where
    one was started) rewritten to say so: the run did not crash, it was refused (exit status 4)."""
    if path:
        try:
            write_incomplete(path, f"refused before any check ran (a usage error, exit status 4): {why}")
        except OSError:
            pass  # the usage error is said on standard error all the same
    return _usage(why)


def badge_path(path: str) -> str:
    """The shields.io endpoint file beside the certificate: ``c.json`` -> ``c.badge.json``."""
    return os.path.splitext(path)[0] + ".badge.json"


def badge(cert: dict) -> dict:
    """A shields.io endpoint badge (``https://img.shields.io/endpoint?url=...``) of the verdict:
    "certified", bright green, only where the headline says nothing more (every property and dtype,
    no declared restriction, no property left uncertified, a profile of at least ``ci``'s examples);
    "certified (narrowed)", yellow-green, where it does: the certificate's headline says how."""
    if cert["verdict"] == "certified" and headline(cert) != "certified":
        return {"schemaVersion": 1, "label": "normcert", "message": "certified (narrowed)", "color": "yellowgreen"}
    colour = {"certified": "brightgreen", "incomplete": "lightgrey", "shard passed": "blue"}.get(cert["verdict"], "red")
    return {"schemaVersion": 1, "label": "normcert", "message": cert["verdict"], "color": colour}


def step_summary(cert: dict) -> str:
    """A short Markdown verdict for a CI job summary (``$GITHUB_STEP_SUMMARY``): the headline, the
    failing cells with their first line, and the command that replays each."""
    lines = [f"### normcert: {headline(cert)}", ""]
    failing = [r for r in cert["results"] if r["outcome"] in ("fail", "error")]
    if cert.get("disagreement"):
        lines += [f"**The run's reports and its results disagree:** {md(cert['disagreement'])}", ""]
    if failing:
        lines += ["| kernel | property | dtype | what failed |", "|---|---|---|---|"]
        for r in failing:
            first = md(str(r["message"]).splitlines()[0], 200) if r["message"] else ""
            lines.append(f"| {r['impl']} | {r['property']} | {r['dtype']} | {first} |")
        replays = [f["replay"] for r in failing for f in (r.get("failures") or [r])
                   if str(f["replay"]).startswith("normcert replay ")]
        if replays:
            lines += ["", "Replay a failing case on any machine:", "", "```", *replays, "```"]
    if cert["not_run"]:
        lines += ["", f"{len(cert['not_run'])} check(s) of the scope did not run, e.g. {cert['not_run'][0]}."]
    return "\n".join(lines) + "\n"


SUMMARY = "GITHUB_STEP_SUMMARY"


def summary_path() -> str:
    """The CI job summary's path (``$GITHUB_STEP_SUMMARY``), "" where none is set."""
    return os.environ.get(SUMMARY, "")


def append_step_summary(cert: dict) -> None:
    """Append ``step_summary`` to ``$GITHUB_STEP_SUMMARY`` where a CI job sets it (GitHub Actions),
    under ``files.why_not_writable`` (the command checked it before its run; a FIFO would block here)."""
    target = summary_path()
    if target:
        problem = why_not_writable(target, "job summary")
        if problem:
            raise UnsafePath(f"${SUMMARY}={target} {problem}")
        with open(target, "a") as f:
            f.write(step_summary(cert))


def own_files(path: str) -> tuple[tuple[str, str], ...]:
    """The certificate's three files, each with its kind (``files.MARKS``): the JSON, the Markdown, the badge."""
    return ((path, "certificate"), (markdown_path(path), "markdown"), (badge_path(path), "badge"))


def outputs(path: str) -> tuple[str, ...]:
    """Every file a certificate at ``path`` writes (another output must not be one of them)."""
    return tuple(target for target, _ in own_files(path))


def write_files(path: str, cert: dict) -> None:
    """Write the JSON, the Markdown and the badge beside it (``files.write_atomic``: never through a
    link, never half-written); where any of the three holds something normcert did not write, none
    is written (OSError)."""
    problem = why_not_written(path)
    if problem:
        raise UnsafePath(f"{problem}: not replaced")
    texts = (to_json(cert), markdown(cert), json.dumps(badge(cert)) + "\n")
    for (target, _), text in zip(own_files(path), texts):
        write_atomic(target, text)


