"""The ``normcert report`` and ``normcert compare`` commands, and ``certify --report``'s writing step.

Each reads certificates with ``report.load`` (held to the schema) and never imports torch.  Bad
input is one line on standard error naming the argument, and exit status 4 (``cli.USAGE``).  No
output replaces an input, one of a certificate's own files (JSON, Markdown, badge), or a file
normcert did not write (``files.foreign``).  ``compare`` exits 1 where B regressed from A
(``compare.regressions``), so that CI can gate on it; 0 otherwise.
"""
from __future__ import annotations

import os
import sys

from ..evidence.certificate import outputs
from ..evidence.files import foreign, write_atomic
from .report import load, render

USAGE = 4


def check_report(path: str, certificate: str | None) -> str:
    """Why ``certify --report path`` cannot be written ("" if it can), checked before the run."""
    if not certificate:
        return "needs --certificate PATH (the report is drawn from the certificate)"
    return check_output(path, "page", [certificate])


def check_output(path: str, kind: str, inputs: list[str]) -> str:
    """Why ``path`` cannot take an output file of ``kind`` (``files.MARKS``) ("" if it can): one of
    the certificates ``inputs`` or their own files, a file normcert did not write, a folder, a link
    or device, a folder that does not exist or is not writable."""
    mine = {os.path.realpath(p): p for c in inputs for p in outputs(c)}
    if os.path.realpath(path) in mine:
        return f"is {mine[os.path.realpath(path)]}, a file of the certificate {_whose(path, inputs)}: choose another path"
    if foreign(path, kind):
        return "exists and is not a file normcert wrote: normcert replaces only its own files; choose another path"
    if os.path.isdir(path):
        return "is a folder, expected a file path"
    if os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
        return "exists and is not a regular file (a link, FIFO or device)"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"folder {folder} is not writable"
    return ""


def _whose(path: str, inputs: list[str]) -> str:
    return next(c for c in inputs if os.path.realpath(path) in {os.path.realpath(p) for p in outputs(c)})


def _render(certificate: str) -> str:
    """The report of the certificate file; ValueError in one line where it cannot be drawn."""
    cert = load(certificate)
    try:
        return render(cert)
    except (KeyError, TypeError, AttributeError) as e:  # only where jsonschema is absent to hold it to the schema
        raise ValueError(f"a malformed certificate ({type(e).__name__}: {e})") from None


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
    """``normcert compare A.json B.json [--format text|markdown|html] [-o PATH]``."""
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
    worse = diff.regressions(*certs, found)
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
        print(f"normcert compare: {a.after} regressed from {a.before}: {worse[0]}"
              + (f" (and {len(worse) - 1} more)" if len(worse) > 1 else ""), file=sys.stderr)
        return 1
    return 0


def _usage(command: str, line: str) -> int:
    print(f"normcert {command}: {line}", file=sys.stderr)
    return USAGE
