"""The certificate as one HTML page that works offline (``normcert report``, ``normcert certify --report``).

``render(certificate)`` returns a single self-contained page: inline CSS and inline SVG, no network,
no script needed to read it (one small inline script only sorts the results table).  From the top:

- the verdict: judged again from the rows (``verdict.rejudge``; a stored verdict that differs is
  said above everything), the certificate's headline, the run's state, any disagreement, the scope and the
  checks that did not run;
- a heat map: a row per kernel, a column per property x dtype, each cell coloured by its worst
  error / bound on a log scale (green to yellow below the bound 1, red above it), grey where the
  kernel is not certified, hatched where an expected check left no result; each cell links to its
  detail;
- a card per failing row (fail, error, expected-fail, warn), and one more for each further distinct
  failure the row's search found (its ``failures``: another exception and place, another output,
  another failure class): its message, worst element, error / bound and ulps, bucket, seed, modes,
  domain, its own ``normcert replay`` command, and, where the replay file can be read, the failing
  row of its input and the failing output's elements: the row's error / bound (ulps apart for
  ``--agree``) element by element and the top 8 (``report_replay``);
- every result row in a sortable table, the checks that did not run, and the run's facts.

The template and its style are package data beside this file (``report_templates/``); the compare
page (``compare.html``) shares the style.
"""
from __future__ import annotations

import functools
import math
import os
import re
import shlex

import jinja2

from ..evidence.bounded_json import loads
from ..evidence.files import regular_or_absent
from ..evidence.certificate import READABLE, SCHEMA, headline, schema
from ..evidence.code import short as code_line
from ..evidence.coverage import describe as describe_coverage
from .report_replay import Replays, replay_view
from ..evidence.verdict import DTYPE_ORDER, rejudge

TEMPLATES = os.path.join(os.path.dirname(__file__), "report_templates")

CARD_OUTCOMES = ("fail", "error", "expected-fail", "warn")
"""Rows that get a counterexample card: the failures, and the notes a passing check left."""

GREY = {"not-supported": "#c8c8c8", "not-certified": "#a0a0a0", "not-run": "#ffffff"}
"""Cells the kernel is not certified on: outside its domain, forward only, or checked on nothing."""

EXPECTED_FAIL = "#8e6bb8"
"""A case study that failed as designed: the suite caught it."""

PASS_SCALE = ((-4.0, (26, 120, 55)), (-1.0, (166, 217, 106)), (0.0, (254, 224, 120)))
"""(log10 of error / bound, colour) stops below the bound: dark green for tiny errors, yellow at 1."""

FAIL_SCALE = ((0.0, (244, 150, 110)), (4.0, (150, 10, 30)))
"""The same above the bound: light red just past 1, dark red 10^4 times past it or not finite."""

TEXT = {"pass": "", "warn": "", "fail": "FAIL", "error": "ERR", "expected-fail": "xfail",
        "not-supported": "n/s", "not-certified": "fwd", "not-run": "not run"}
"""The short word a cell shows beside (or instead of) its error / bound."""


def number(value) -> float:
    """A certificate's number as a float: non-finite ones arrive as the strings "inf", "-inf", "nan"."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def short(value) -> str:
    """A number to 3 significant digits; "inf" and "nan" as they are; None (not measured) as "-"."""
    if value is None:
        return "-"
    v = number(value)
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def sortkey(value) -> str:
    """A number as the sort script's ``parseFloat`` reads it ("Infinity", "NaN" for the non-finite)."""
    v = number(value)
    return repr(v) if math.isfinite(v) else {"inf": "Infinity", "-inf": "-Infinity"}.get(str(v), "NaN")


def plain(value) -> str:
    """A fact's value in words: a list joined by commas, null as "-"."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def _blend(scale, at: float) -> tuple[int, int, int]:
    at = min(max(at, scale[0][0]), scale[-1][0])
    for (x0, c0), (x1, c1) in zip(scale, scale[1:]):
        if at <= x1:
            f = (at - x0) / (x1 - x0)
            return tuple(round(a + (b - a) * f) for a, b in zip(c0, c1))
    return scale[-1][1]


def colour(outcome: str, units) -> str:
    """A cell's fill: on the log scale of error / bound for a check that ran, grey for a cell the
    kernel is not certified on, purple for a case study's expected failure."""
    if outcome in GREY:
        return GREY[outcome]
    if outcome == "expected-fail":
        return EXPECTED_FAIL
    u = number(units)
    if outcome in ("fail", "error") or not math.isfinite(u) or u > 1:
        over = math.log10(u) if math.isfinite(u) and u > 1 else FAIL_SCALE[-1][0]
        return "#%02x%02x%02x" % _blend(FAIL_SCALE, over)
    return "#%02x%02x%02x" % _blend(PASS_SCALE, math.log10(u) if u > 0 else PASS_SCALE[0][0])


def ink(fill: str) -> str:
    """Black or white text, whichever reads better on ``fill``."""
    r, g, b = (int(fill[k:k + 2], 16) for k in (1, 3, 5))
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"


def anchor(text: str, taken: set) -> str:
    """An HTML id made of ``text``'s letters and digits, unique on the page."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}-{k}"
    taken.add(name)
    return name


def split_not_run(entry: str) -> tuple[str, str, str]:
    """A ``not_run`` entry "kernel id property dtype" as (kernel, property, dtype); a kernel id may hold spaces."""
    parts = entry.rsplit(" ", 2)
    return tuple(parts) if len(parts) == 3 else (entry, "", "")


def worst_row(rows: list[dict]) -> dict:
    """The row a cell shows when one check left several: a failing one first, then the largest error / bound."""
    rank = {"error": 0, "fail": 0, "expected-fail": 1, "warn": 2}
    return min(rows, key=lambda r: (rank.get(r["outcome"], 3), -_sortable(r["worst_units"])))


def _sortable(value) -> float:
    v = number(value)
    return math.inf if math.isnan(v) else v


def columns(cert: dict, not_run: list[tuple]) -> list[tuple[str, str]]:
    """(property, dtype) columns: properties in the certificate's order (its declared scope, else as
    its rows and ``not_run`` first name them), dtypes in ``DTYPE_ORDER``."""
    seen = [(r["property"], r["dtype"]) for r in cert["results"]] + [(p, d) for _, p, d in not_run]
    scoped = cert.get("scope", {}).get("properties")
    props = list(dict.fromkeys((list(scoped) if isinstance(scoped, list) else []) + [p for p, _ in seen]))
    present = set(seen)
    order = {d: k for k, d in enumerate(DTYPE_ORDER)}
    return [(p, d) for p in props for d in sorted({d for q, d in present if q == p}, key=lambda d: order.get(d, 99))]


def heat_map(cert: dict, ids: dict) -> dict:
    """The heat map's kernels, columns and cells.  A cell is None where the kernel has no such check
    (a property that does not apply to its op); else its outcome ("not-run" for an expected check
    with no row), fill, words (one a line), tooltip and the id of its detail (``ids``: (kernel, property, dtype) -> id)."""
    not_run = [split_not_run(e) for e in cert.get("not_run", [])]
    rows: dict[tuple, list[dict]] = {}
    for r in cert["results"]:
        rows.setdefault((r["impl"], r["property"], r["dtype"]), []).append(r)
    kernels = list(cert.get("implementations", {}))
    kernels += [k for k, _, _ in list(rows) + not_run if k not in kernels]
    cols = columns(cert, not_run)
    missing = {(k, p, d) for k, p, d in not_run}
    grid = []
    for kernel in kernels:
        line = []
        for prop, dtype in cols:
            key = (kernel, prop, dtype)
            if key in rows:
                line.append(_cell(key, worst_row(rows[key]), ids[key]))
            elif key in missing:
                line.append({"key": "|".join(key), "outcome": "not-run", "fill": "", "ink": "#000",
                             "text": [TEXT["not-run"]], "title": f"{kernel} {prop} {dtype}: expected, but no result",
                             "href": ids[key]})
            else:
                line.append(None)
        grid.append({"kernel": kernel, "cells": line})
    return {"columns": cols, "properties": _spans([p for p, _ in cols]), "rows": grid}


def _cell(key: tuple, row: dict, href: str) -> dict:
    outcome = row["outcome"]
    fill = colour(outcome, row["worst_units"])
    ran = outcome not in GREY
    text = [t for t in (TEXT.get(outcome, outcome), short(row["worst_units"]) if ran else "") if t]
    title = (f"{' '.join(key)}: {outcome}; error/bound {short(row['worst_units'])}, "
             f"{short(row['worst_ulps'])} ulp" + (f"; {row['message'].splitlines()[0]}" if row["message"] else ""))
    return {"key": "|".join(key), "outcome": outcome, "fill": fill, "ink": ink(fill), "text": text,
            "title": title, "href": href}


def _spans(props: list[str]) -> list[tuple[str, int]]:
    """(property, number of its dtype columns), for the heat map's upper header row."""
    out: list[list] = []
    for p in props:
        if out and out[-1][0] == p:
            out[-1][1] += 1
        else:
            out.append([p, 1])
    return [tuple(x) for x in out]


FIELDS = re.compile(r"\b(seed|cot_seed|bucket)=([^,)]+)")


def where_fields(where: str) -> dict[str, str]:
    """The bucket and seed(s) that ``worst_where`` names ("..., seed=123, bucket=odd 3x769, ...")."""
    return {k: v.strip() for k, v in FIELDS.findall(where or "")}


def replay_file(command: str) -> str:
    """The replay file a row's ``replay`` field names ("normcert replay [--impl SPEC] PATH"), or "" for
    none."""
    if not command.startswith("normcert replay "):
        return ""
    try:
        words = shlex.split(command)
    except ValueError:
        return ""
    return words[-1] if len(words) == 3 or (len(words) == 5 and words[2] == "--impl") else ""


CARDS_PER_ROW = 16
"""The most cards one row gets (its first failure and the next of its ``failures``); the last card
says how many more the row holds: a row of 20,000 failures is not 20,000 cards."""


def distinct(r: dict) -> list[dict]:
    """Each distinct failure of a row as a row of its own for a card, at most ``CARDS_PER_ROW``: the
    row itself (its first failure), then each further entry of its ``failures`` with that failure's
    message, case, replay command, error / bound and ulps (None where it failed no measurement).
    Every card's error / bound and ulps are its case's: the first card's are its failure entry's, and
    the row's own (its worst over every example it ran, which may be another, unshrunk case's) are
    its ``row_worst``."""
    failures = r.get("failures") or []
    n = len(failures)
    first = {**r, "of": f"failure 1 of {n}: {failures[0]['kind']}" if n > 1 else ""}
    if failures:  # the figures of the case the card shows, not the row's worst over every example it ran
        first.update(worst_units=failures[0].get("worst_units"), worst_ulps=failures[0].get("worst_ulps"),
                     row_worst=(r["worst_units"], r["worst_ulps"]))
    out = [first] + [{**r, "message": f["message"], "worst_where": f["where"], "replay": f["replay"],
                      "worst_units": f.get("worst_units"), "worst_ulps": f.get("worst_ulps"),
                      "of": f"failure {j} of {n}: {f['kind']}"}
                     for j, f in enumerate(failures[1:CARDS_PER_ROW], 2)]
    if n > len(out):
        out[-1] = {**out[-1], "of": f"{out[-1]['of']}; the row's other {n - len(out)} failures are left out of this page "
                                    f"(the certificate holds them)"}
    return out


def cards(cert: dict, ids: dict) -> list[dict]:
    """A card per distinct failure of each row in ``CARD_OUTCOMES`` (``distinct``), failing rows first
    (``ids``: (row index, failure index) -> the card's id), each with the fields its
    ``worst_where`` names and the view of its replay file, checked against the row (each file read
    once for the page: ``report_replay.Replays``)."""
    order = {o: k for k, o in enumerate(CARD_OUTCOMES)}
    out, replays, rows = [], Replays(), {}
    for k, j in sorted(ids, key=lambda kj: (order[cert["results"][kj[0]]["outcome"]], kj)):
        if k not in rows:
            rows[k] = distinct(cert["results"][k])
        r = rows[k][j]
        path = replay_file(r["replay"])
        out.append({"row": r, "id": ids[k, j], "fields": where_fields(r["worst_where"]),
                    "replay": replay_view(path, r["worst_where"], r["message"], replays, cell(r)) if path else None})
    return out


def cell(r: dict) -> tuple[str, str, str, str] | None:
    """(op, property, kernel, dtype) of a row (its ``impl`` is "OP:KERNEL"); None for a row naming no op."""
    if not r.get("op"):
        return None
    op, impl = str(r["op"]), str(r["impl"])
    return op, r["property"], impl[len(op) + 1:] if impl.startswith(op + ":") else impl, r["dtype"]


def detail_ids(cert: dict) -> tuple[dict, dict, dict]:
    """(cell key -> id of its detail, row index -> id of its line in the results table, (row index,
    failure index) -> id of its card).  A cell with a card links to its (first) card, another to its
    line in the results table, a check that did not run to its line in the not-run list."""
    taken: set = set()
    cells, lines, card_ids = {}, {}, {}
    for k, r in enumerate(cert["results"]):
        key = (r["impl"], r["property"], r["dtype"])
        lines[k] = anchor("row-" + "-".join(key), taken)
        if r["outcome"] in CARD_OUTCOMES:
            for j in range(len(distinct(r))):
                card_ids[k, j] = anchor("card-" + "-".join(key) + (f"-failure-{j + 1}" if j else ""), taken)
            cells.setdefault(key, card_ids[k, 0])
    for k, r in enumerate(cert["results"]):
        cells.setdefault((r["impl"], r["property"], r["dtype"]), lines[k])
    for entry in cert.get("not_run", []):
        key = split_not_run(entry)
        cells.setdefault(key, anchor("not-run-" + "-".join(key), taken))
    return cells, lines, card_ids


def facts(cert: dict) -> dict:
    """The run's facts: environment, config, scope, implementations, each kernel's Triton paths in
    words (``coverage.describe``; a certificate before them has none) and time in checks."""
    seconds = sum(v for v in (number(r["seconds"]) for r in cert["results"]) if math.isfinite(v))
    return {"environment": cert.get("environment", {}), "config": cert.get("config", {}),
            "scope": cert.get("scope", {}), "implementations": cert.get("implementations", {}),
            "seconds": seconds, "pytest_exit_status": cert.get("pytest_exit_status"),
            "crashed": cert.get("crashed", []), "deselected": cert.get("deselected", []),
            "triton_paths": [(k, describe_coverage(i["triton"])) for k, i in sorted(cert.get("implementations", {}).items())
                             if i.get("triton")]}


def environment() -> jinja2.Environment:
    """The Jinja environment of the report's templates: HTML-escaped by default."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["short"] = short
    env.filters["plain"] = plain
    env.filters["sortkey"] = sortkey
    env.filters["code"] = code_line
    return env


@functools.cache
def _validator():
    """The published schema's validator, made once per process: ``jsonschema.validate`` checks the
    schema itself and builds a validator at every call (about 45 ms, 20 times the validation of a
    small certificate), which a merge or report of many shards paid at every file."""
    import jsonschema  # noqa: PLC0415 - in the test extra, not the core install

    cls = jsonschema.validators.validator_for(schema())
    cls.check_schema(schema())
    return cls(schema())


def load(path: str) -> dict:
    """The certificate at ``path``, held to the published schema (with ``jsonschema`` where it is
    installed, else its required fields); ValueError says in one line what is wrong.  Only a regular
    file is read (a FIFO would block the command forever)."""
    if not regular_or_absent(path):
        raise ValueError("is not a regular file (a FIFO, device or folder)")
    try:
        with open(path, encoding="utf-8") as f:
            cert = loads(f.read())
    except OSError as e:
        raise ValueError(e.strerror or str(e)) from None
    except ValueError as e:
        raise ValueError(f"not JSON ({str(e)[:120]})") from None
    if not isinstance(cert, dict) or cert.get("schema") not in READABLE:
        found = cert.get("schema") if isinstance(cert, dict) else type(cert).__name__
        raise ValueError(f"not a {SCHEMA} certificate (its schema: {found!r})")
    try:
        import jsonschema  # noqa: PLC0415 - in the test extra, not the core install
    except ImportError:
        missing = [k for k in schema()["required"] if k not in cert]
        if missing:
            raise ValueError(f"not a complete certificate: no {', '.join(missing)}") from None
        return cert
    try:
        _validator().validate({**cert, "schema": SCHEMA})  # an older READABLE one is held to this schema
    except jsonschema.ValidationError as e:
        raise ValueError(f"does not fit the schema at {e.json_path}: {e.message.splitlines()[0][:160]}") from None
    return cert


def render(certificate: dict) -> str:
    """The report of ``certificate`` (a dict as the JSON holds it) as one HTML page."""
    cells, lines, card_ids = detail_ids(certificate)
    not_run = [(entry, cells[split_not_run(entry)]) for entry in certificate.get("not_run", [])]
    judged = rejudge(certificate)  # the rows' verdict, whatever the file stores (a hand-edited "certified")
    return environment().get_template("report.html").render(
        cert=certificate, judged=judged, headline=headline({**certificate, "verdict": judged}),
        heat=heat_map(certificate, cells),
        cards=cards(certificate, card_ids), lines=lines, not_run=not_run, facts=facts(certificate),
        legend=legend())


def legend() -> dict:
    """The heat map's key: the colour scale from 10^-4 to 10^4 times the bound as SVG gradient stops
    (offset 0..1, 1 at the middle), and the fixed colours."""
    stops = [((x + 4) / 8, colour("pass", 10 ** x)) for x in (-4, -3, -2, -1, 0)]
    stops += [((x + 4) / 8, colour("fail", 10 ** x)) for x in (0.001, 1, 2, 3, 4)]
    return {"stops": stops, "grey": GREY, "expected_fail": EXPECTED_FAIL}
