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
