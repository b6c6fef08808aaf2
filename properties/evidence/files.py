"""Writing normcert's own files (certificates, replay files, run records) so that no write goes
through a link or leaves half a file.

``write_atomic(path, data)`` writes ``data`` to a fresh file of an unpredictable name in ``path``'s
folder (``tempfile.mkstemp``: created with ``O_EXCL``, so a link planted at any name cannot be
followed) and renames it over ``path`` (``os.replace``, atomic: a reader sees the old file or the
new one).  A link at ``path`` itself is refused rather than replaced or followed: a committed or
planted link beside a certificate names somebody else's file.

``foreign(path, kind)``: normcert replaces only files it wrote.  Each kind of file it writes begins
with its own mark (``MARKS``): a path that exists and does not begin so (a user's package.json, the
kernel's own source, a README) is somebody else's, and every command that writes refuses it before
it runs.  ``regular_or_absent(path)``: what a command reads or appends to must be a regular file (a
FIFO would block it forever).

``why_not_writable(path, kind, taken)`` is the one rule for every path normcert writes (a
certificate's JSON, Markdown and badge, the report, compare's output, the CI job summary, a replay
file): a regular file or a new one in a writable folder, never an input of the same command nor
another file the command writes, never somebody else's file (``foreign``; the job summary, which
normcert appends to and does not own, excepted), never through a link.  Every writer asks it, and
the commands ask it before their run.
"""
from __future__ import annotations

import os
import tempfile


MARKS = {
    "certificate": b'{"run": ',  # certificate.to_json puts the run's state first
    "markdown": b"# normcert certificate",
    "badge": b'{"schemaVersion": 1, "label": "normcert"',
    "page": b"<!DOCTYPE html>\n<!-- normcert -->",  # the report and the compare page (report_templates/base.html)
    "compare text": b"normcert compare ",
    "compare markdown": b"### normcert compare ",
    "replay": b"PK\x03\x04",  # a replay file is an .npz: a zip archive (replay.save_failure)
    "reproducer": b"#!/usr/bin/env python3\n# normcert reproducer: ",  # replay --export (reproducer.TEMPLATE)
}
"""How each kind of file normcert writes begins."""


def foreign(path: str, kind: str) -> bool:
    """Does ``path`` exist and hold something other than a normcert file of ``kind`` (``MARKS``)?"""
    if not os.path.isfile(path):
        return False
    mark = MARKS[kind]
    try:
        with open(path, "rb") as f:
            return f.read(len(mark)) != mark
    except OSError:
        return True


APPENDED = ("job summary",)
"""Kinds normcert appends to and does not own (``$GITHUB_STEP_SUMMARY``): no mark is asked of them."""

WHAT = {"markdown": "certificate (the Markdown is written beside the JSON)",
        "badge": "badge (the badge is written beside the JSON)", "page": "page", "replay": "replay file"}
"""How a refusal names each kind of file (the kind's own name where absent)."""


def why_not_writable(path: str, kind: str, taken: dict[str, str] | None = None) -> str:
    """Why normcert may not write a file of ``kind`` (``MARKS`` or ``APPENDED``) at ``path``, as a phrase
    that follows the path ("" where it may).  Refused: a path that is (by ``os.path.realpath``) one of
    ``taken`` (path -> what it is: an input of the same command, one of an input certificate's files,
    another file the command writes), a folder, a link, FIFO or device, a file that is not normcert's
    own of ``kind`` (``foreign``), a missing folder, or one not writable."""
    real = os.path.realpath(path)
    for named, what in (taken or {}).items():
        if os.path.realpath(named) == real:
            return f"is {named}, {what}: choose another path"
    if os.path.isdir(path):
        return "is a folder, expected a file path"
    if not regular_or_absent(path):
        return "exists and is not a regular file (a link, FIFO or device): expected a regular file or a new path"
    if kind not in APPENDED and foreign(path, kind):
        return (f"exists and is not a normcert {WHAT.get(kind, kind)}: normcert replaces only files it wrote; "
                f"choose another path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "is not writable"
    return ""


def regular_or_absent(path: str) -> bool:
    """Is ``path`` a regular file or absent (not a FIFO, device or folder, which a read or an append
    would block on or fail at)?"""
    return not os.path.lexists(path) or (os.path.isfile(path) and not os.path.islink(path))


class UnsafePath(OSError):
    """``path`` is a link or not a regular file: normcert does not write there."""


def refuse_unsafe(path: str) -> None:
    """Raise ``UnsafePath`` if ``path`` exists and is a link or anything but a regular file."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isfile(path)):
        raise UnsafePath(f"{path} is a link or not a regular file: normcert writes regular files only")


def write_atomic(path: str, data: bytes | str) -> None:
    """Replace ``path`` by a regular file holding ``data`` (str is written as UTF-8), never through a
    link and never half-written (module docstring)."""
    refuse_unsafe(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".normcert-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
