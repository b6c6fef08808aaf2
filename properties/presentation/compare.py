"""Two certificates side by side (``normcert compare A.json B.json``): the cells that changed.

A cell is one (kernel, property, dtype) check: its outcome and worst error / bound, taken from its
result row (the worst row where one check left several, as the report's heat map shows it) or
"not-run" where the certificate lists it in ``not_run``.  A cell changed when it is in one
certificate only (added, removed), or its outcome or its error / bound differs (NaN equals NaN).
The changes read as text (a terminal), Markdown (a CI job summary, a pull request) or an HTML
page in the report's style.

Each certificate's verdict is judged again from its rows (``verdict.rejudge``), as the certify
parent does; where that differs from the verdict it stores, the page says so.  B *regressed* from A
(``regressions``) where A's rows certify and B's do not, or where a cell that did not fail in A
(or was not there) fails in B (``verdict.FAILING``): ``normcert compare`` then exits 1.  What counts
is chosen with ``--fail-on`` (``FAIL_ON``, ``failures``), as ``diff`` exits 1 on any difference and
``git diff --exit-code`` only when asked.

The code each kernel ran (``evidence.code``) is a fact of the run too: where it changed, the page
names the kernel and the files edited, added or removed (``code_changes``).  A code change is what
a comparison is usually made across (a kernel's pull request against its base), so it is no
regression: ``--fail-on any-change`` counts it, the default does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .report import environment, number, short, split_not_run, worst_row
from ..evidence import code
from ..evidence.verdict import DTYPE_ORDER, FAILING, rejudge


@dataclass(frozen=True)
class Change:
    """One cell that differs: ``before`` / ``after`` are (outcome, error / bound), None where absent."""
    kernel: str
    property: str
    dtype: str
    before: tuple[str, object] | None
    after: tuple[str, object] | None

    @property
    def kind(self) -> str:
        """"added", "removed", "outcome" (the outcome changed) or "error / bound" (only the number did)."""
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "outcome" if self.before[0] != self.after[0] else "error / bound"

    @property
    def ratio(self) -> str:
        """after / before of error / bound, "" where it says nothing (absent, zero or not finite)."""
        if self.before is None or self.after is None:
            return ""
        a, b = number(self.before[1]), number(self.after[1])
        return f"x{b / a:.3g}" if math.isfinite(a) and math.isfinite(b) and a > 0 else ""


def cells(cert: dict) -> dict[tuple[str, str, str], tuple[str, object]]:
    """(kernel, property, dtype) -> (outcome, error / bound) of every check of ``cert``."""
    rows: dict[tuple, list[dict]] = {}
    for r in cert.get("results", []):
        rows.setdefault((r["impl"], r["property"], r["dtype"]), []).append(r)
    out = {key: (worst_row(rs)["outcome"], worst_row(rs)["worst_units"]) for key, rs in rows.items()}
    for entry in cert.get("not_run", []):
        out.setdefault(split_not_run(entry), ("not-run", None))
    return out


def _same(a, b) -> bool:
    """Two error / bound values are the same number (NaN is NaN; None, a check that did not run, is only None)."""
    if a is None or b is None:
        return a is b
    x, y = number(a), number(b)
    return x == y or (math.isnan(x) and math.isnan(y))


def changes(a: dict, b: dict) -> list[Change]:
    """The cells that differ from certificate ``a`` to ``b``, by kernel, property and dtype order."""
    before, after = cells(a), cells(b)
    order = {d: k for k, d in enumerate(DTYPE_ORDER)}
    out = []
    for key in sorted(before.keys() | after.keys(), key=lambda k: (k[0], k[1], order.get(k[2], 99), k[2])):
        x, y = before.get(key), after.get(key)
        if x is None or y is None or x[0] != y[0] or not _same(x[1], y[1]):
            out.append(Change(*key, x, y))
    return out


def regressions(a: dict, b: dict, found: list[Change]) -> list[str]:
    """How certificate ``b`` regressed from ``a`` (module docstring), one phrase each; [] where it did not."""
    out = []
    if rejudge(a) == "certified" != rejudge(b):
        out.append("its rows no longer certify (certified -> not certified)")
    for c in found:
        if c.after is not None and c.after[0] in FAILING and (c.before is None or c.before[0] not in FAILING):
            out.append(f"{c.kernel} {c.property} {c.dtype}: {_state(c.before)} -> {_state(c.after)}")
    return out


FAIL_ON = ("regression", "any-change", "never")
"""``normcert compare --fail-on``: exit 1 on a regression (the default), on any change (a cell, the
judged verdict, a fact of the run or a kernel's code: ``diff``'s rule), or never (the comparison is
only shown)."""


def failures(a: dict, b: dict, found: list[Change], fail_on: str) -> list[str]:
    """What makes ``compare`` exit 1 under ``--fail-on fail_on`` (``FAIL_ON``), one phrase each; [] for none."""
    if fail_on == "never":
        return []
    worse = regressions(a, b, found)
    if fail_on == "regression":
        return worse
    judged = rejudge(a), rejudge(b)
    other = [f"verdict {judged[0]} -> {judged[1]}"] if judged[0] != judged[1] else []
    other += [f"{label} changed" for label, fact in FACTS if fact(a) != fact(b)]
    other += [f"code of {kernel} changed" for kernel, _ in code_changes(a, b)]
    other += [f"{c.kernel} {c.property} {c.dtype}: {_state(c.before)} -> {_state(c.after)}" for c in found]
    return worse + [o for o in other if o not in worse]


def verdicts(a_name: str, b_name: str, a: dict, b: dict) -> list[str]:
    """The two verdicts as the rows give them, where a certificate's stored verdict says otherwise,
    and every fact of the run that changed (``FACTS``: what the cells were checked on and how)."""
    judged = rejudge(a), rejudge(b)
    lines = [f"verdict: {judged[0]} -> {judged[1]} (judged from the rows)"]
    for name, cert, rows_say in ((a_name, a, judged[0]), (b_name, b, judged[1])):
        if cert.get("verdict") != rows_say:
            lines.append(f"{name} says {cert.get('verdict')!r}, but its rows say {rows_say!r}")
    for label, fact in FACTS:
        x, y = fact(a), fact(b)
        if x != y:
            lines.append(f"{label}: {x or '-'} -> {y or '-'}")
    lines += [f"code of {kernel} changed: {'; '.join(what)}" for kernel, what in code_changes(a, b)]
    return lines


def code_changes(a: dict, b: dict) -> list[tuple[str, list[str]]]:
    """(kernel, how its code changed: ``code.changes``) for each kernel of both certificates whose
    code differs: the files edited, added or removed and the distribution's version."""
    x, y = a.get("implementations", {}), b.get("implementations", {})
    found = [(k, code.changes(x[k].get("code"), y[k].get("code"))) for k in sorted(x.keys() & y.keys())]
    return [(k, what) for k, what in found if what]


def _domains(cert: dict) -> str:
    return "; ".join(f"{k}: {v.get('certified_on') or 'all'}" for k, v in sorted(cert.get("implementations", {}).items()))


FACTS = (
    ("run", lambda c: str(c.get("run", ""))),
    ("scope", lambda c: "; ".join(f"{k} {v if isinstance(v, str) else ', '.join(v)}"
                                  for k, v in sorted(c.get("scope", {}).items()))),
    ("declared domains", _domains),
    ("profile", lambda c: str(c.get("environment", {}).get("profile") or "")),
    ("device", lambda c: " ".join(str(c.get("environment", {}).get(k) or "") for k in ("device", "device_name")).strip()),
)
"""The run's facts a comparison names where they changed: a cell compared across them is not the same check."""


def _state(cell) -> str:
    if cell is None:
        return "-"
    return cell[0] if cell[1] is None else f"{cell[0]} {short(cell[1])}"


def text(a_name: str, b_name: str, a: dict, b: dict, found: list[Change]) -> str:
    """The verdicts and the changes as an aligned plain-text table."""
    head = "\n".join([f"normcert compare {a_name} -> {b_name}: {len(found)} cell(s) changed",
                      *verdicts(a_name, b_name, a, b)])
    if not found:
        return head + "\n"
    rows = [("kernel", "property", "dtype", "before", "after", "change")]
    rows += [(c.kernel, c.property, c.dtype, _state(c.before), _state(c.after), f"{c.kind} {c.ratio}".strip())
             for c in found]
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "\n".join([head, ""] + ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]) + "\n"


def markdown(a_name: str, b_name: str, a: dict, b: dict, found: list[Change]) -> str:
    """The verdicts and the changes as a Markdown table (a CI job summary, a pull request comment)."""
    cell = lambda v: v.replace("|", "\\|").replace("<", "&lt;")  # noqa: E731 - a kernel id is not markup
    lines = [f"### normcert compare `{cell(a_name)}` → `{cell(b_name)}`: {len(found)} cell(s) changed", "",
             *(f"- {cell(line)}" for line in verdicts(a_name, b_name, a, b)), ""]
    if found:
        lines += ["| kernel | property | dtype | before | after | change |", "|---|---|---|---|---|---|"]
        lines += [f"| {cell(c.kernel)} | {cell(c.property)} | {cell(c.dtype)} | {_state(c.before)} | {_state(c.after)} | "
                  f"{(c.kind + ' ' + c.ratio).strip()} |" for c in found]
    return "\n".join(lines) + "\n"


def html(a_name: str, b_name: str, a: dict, b: dict, found: list[Change]) -> str:
    """The changes as one self-contained HTML page in the report's style."""
    return environment().get_template("compare.html").render(a_name=a_name, b_name=b_name, a=a, b=b, changes=found,
                                                              state=_state, judged=rejudge,
                                                              verdicts=verdicts(a_name, b_name, a, b))
