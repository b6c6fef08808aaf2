"""How a replay file is named, and whether a file is the one its name and the row naming it say.

A replay file is saved as ``CELL-HASH.npz`` (``name``): ``CELL`` the failing cell ("OP-KERNEL-PROPERTY-
DTYPE", then "-2" for a cell's second distinct failure, every character outside ``[A-Za-z0-9_.-]``
made "_"), ``HASH`` the first ``HASH_DIGITS`` hex digits of the SHA-256 of the file's bytes.  The same
failure saves to the same file, and another failure never replaces the file an older certificate names.

``mismatch(path, digest, op, prop, kernel, dtype)`` says why the file at ``path`` is not that cell's
failure ("" where nothing says it is not): its bytes no longer hash to its name (replaced after the
run), or its name is another cell's.  A file not named so (an older normcert's, a user's copy) is
judged by what its metadata says alone.  No torch: the report reads this.
"""
from __future__ import annotations

import hashlib
import os
import re

HASH_DIGITS = 10
"""Of the SHA-256 in a replay file's name: 40 bits, no clash between a folder's failures."""

STAMPED = re.compile(rf"^(?P<cell>.+?)(?P<nth>-[0-9]+)?-(?P<hash>[0-9a-f]{{{HASH_DIGITS}}})\.npz$")


def cell(op: str, kernel: str, prop: str, dtype: str, suffix: str = "") -> str:
    """The cell part of a replay file's name (``kernel``: the kernel's name, without its op)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{op}-{kernel}-{prop}-{dtype}{suffix}")


def name(cell_name: str, data: bytes) -> str:
    """The file name of a replay file of ``data`` for the cell ``cell_name``."""
    return f"{cell_name}-{hashlib.sha256(data).hexdigest()[:HASH_DIGITS]}.npz"


def digest(path: str, chunk: int = 1 << 20) -> str:
    """The SHA-256 of the file at ``path``, in hex, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def mismatch(path: str, sha: str, op: str, prop: str, kernel: str | None = None, dtype: str | None = None) -> str:
    """Why the replay file at ``path`` (its bytes' SHA-256 ``sha``) is not the failure of the cell
    (``op``, ``prop`` and, where known, ``kernel`` and ``dtype``), "" where nothing says so (module
    docstring)."""
    m = STAMPED.match(os.path.basename(path))
    if m is None:
        return ""
    if not sha.startswith(m["hash"]):
        return (f"its bytes are not those it was saved with (their SHA-256 begins {sha[:HASH_DIGITS]}, its name says "
                f"{m['hash']}): the file was replaced after the run")
    if kernel is not None and dtype is not None:
        wanted = cell(op, kernel, prop, dtype)
        if m["cell"] != wanted:
            return f"its name is the cell {m['cell']}'s, not {wanted}"
    elif not (m["cell"].startswith(f"{op}-") and f"-{prop}-" in m["cell"]):  # op and property names are words
        return f"its name is the cell {m['cell']}'s, not one of {op} {prop}"
    return ""
