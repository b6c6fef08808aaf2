"""The ``normcert report`` and ``normcert compare`` commands, and ``certify --report``'s writing step.

Each reads certificates with ``report.load`` (held to the schema) and never imports torch.  Bad
input is one line on standard error naming the argument, and exit status 4 (``cli.USAGE``).  No
output replaces an input, one of a certificate's own files (JSON, Markdown, badge), or a file
normcert did not write: every path is held to ``files.why_not_writable``.  ``compare`` exits 1 where B regressed from A
(``compare.regressions``; ``--fail-on`` chooses: ``compare.FAIL_ON``), so that CI can gate on it; 0 otherwise.
"""
from __future__ import annotations

import os
import sys

from jinja2 import UndefinedError

from ..evidence.certificate import outputs, summary_path
from ..evidence.files import why_not_writable, write_atomic
from .report import load, render

USAGE = 4


def check_certify(certificate: str | None, report_path: str | None) -> str:
    """Why ``certify`` may not write its outputs besides the certificate (which its run checks before
    any kernel is imported), as "OPTION PATH: why" ("" where it may): the report (``--report``) and
    the CI job summary (``$GITHUB_STEP_SUMMARY``, which a FIFO would block), each held to
    ``files.why_not_writable`` with the command's other outputs taken."""
    mine = {p: f"a file of the certificate {certificate}" for p in outputs(certificate)} if certificate else {}
    summary = summary_path()
    if report_path:
        if not certificate:
            return f"--report {report_path}: needs --certificate PATH (the report is drawn from the certificate)"
        problem = why_not_writable(report_path, "page",
                                   {**mine, **({summary: "the CI job summary ($GITHUB_STEP_SUMMARY)"} if summary else {})})
        if problem:
            return f"--report {report_path}: {problem}"
    if summary:
        problem = why_not_writable(summary, "job summary", {**mine, **({report_path: "the --report"} if report_path else {})})
        if problem:
            return f"$GITHUB_STEP_SUMMARY={summary}: {problem}"
    return ""


def check_output(path: str, kind: str, inputs: list[str]) -> str:
    """Why ``path`` cannot take an output file of ``kind`` (``files.MARKS``) ("" if it can): the rule
    of ``files.why_not_writable``, each of the certificates ``inputs`` and its own files taken."""
    return why_not_writable(path, kind, {p: f"a file of the certificate {c}" for c in inputs for p in outputs(c)})


def _render(certificate: str) -> str:
    """The report of the certificate file; ValueError in one line where it cannot be drawn."""
    cert = load(certificate)
    try:
        return render(cert)
    except (KeyError, TypeError, AttributeError, UndefinedError) as e:  # only where jsonschema is absent to hold it
        raise ValueError(f"a malformed certificate ({type(e).__name__}: {str(e)[:160]})") from None


def write_report(certificate: str, path: str) -> str:
    """Write the report of ``certificate`` to ``path``; "" or why it was not written."""
    try:
        write_atomic(path, _render(certificate))
    except ValueError as e:
        return f"{certificate}: {e}"
    except OSError as e:  # UnsafePath too: a link planted at the path
        return f"{path}: {getattr(e, 'strerror', None) or e}"
    return ""


def report(a) -> int:
    """``normcert report CERT.json [-o PATH]``."""
    out = a.output or os.path.splitext(a.certificate)[0] + ".html"
    flag = f"-o {a.output}" if a.output else f"{out} (the default output beside CERT.json)"
    problem = check_output(out, "page", [a.certificate])
    if problem:
        return _usage("report", f"{flag}: {problem}")
    try:
        page = _render(a.certificate)
    except ValueError as e:
        return _usage("report", f"{a.certificate}: {e}")
    try:
        write_atomic(out, page)
    except OSError as e:  # UnsafePath too: a link planted at the path
        return _usage("report", f"{flag}: {getattr(e, 'strerror', None) or e}")
    print(f"normcert report: {out} ({len(page.encode()) // 1024} KiB)")
    return 0


def compare(a) -> int:
    """``normcert compare A.json B.json [--format text|markdown|html] [-o PATH] [--fail-on WHAT]``: exit 1
    where ``compare.failures`` finds what ``--fail-on`` counts, 0 otherwise, 4 on bad input."""
    from . import compare as diff  # noqa: PLC0415

    certs = []
    for path in (a.before, a.after):
        try:
            certs.append(load(path))
        except ValueError as e:
            return _usage("compare", f"{path}: {e}")
    if a.output:
        kind = {"html": "page", "markdown": "compare markdown"}.get(a.format, "compare text")
        problem = check_output(a.output, kind, [a.before, a.after])
        if problem:
            return _usage("compare", f"-o {a.output}: {problem}")
    found = diff.changes(*certs)
    worse = diff.failures(*certs, found, a.fail_on)
    if a.format == "html":
        page = diff.html(a.before, a.after, *certs, found)
    else:
        page = (diff.markdown if a.format == "markdown" else diff.text)(a.before, a.after, *certs, found)
    if not a.output:
        sys.stdout.write(page)
    else:
        try:
            write_atomic(a.output, page)
        except OSError as e:  # UnsafePath too: a link planted at the path
            return _usage("compare", f"-o {a.output}: {getattr(e, 'strerror', None) or e}")
    if worse:
        how = "regressed from" if a.fail_on == "regression" else "changed from"
        print(f"normcert compare: {a.after} {how} {a.before}: {worse[0]}"
              + (f" (and {len(worse) - 1} more)" if len(worse) > 1 else ""), file=sys.stderr)
        return 1
    return 0


def _usage(command: str, line: str) -> int:
    print(f"normcert {command}: {line}", file=sys.stderr)
    return USAGE
