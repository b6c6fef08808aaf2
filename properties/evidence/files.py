"""Writing normcert's own files (certificates, replay files, run records) so that no write goes
through a link or leaves half a file.

``write_atomic(path, data)`` writes ``data`` to a fresh file of an unpredictable name in ``path``'s
folder (``tempfile.mkstemp``: created with ``O_EXCL``, so a link planted at any name cannot be
followed) and renames it over ``path`` (``os.replace``, atomic: a reader sees the old file or the
new one).  A link at ``path`` itself is refused rather than replaced or followed: a committed or
planted link beside a certificate names somebody else's file.
"""
from __future__ import annotations

import os
import tempfile


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
