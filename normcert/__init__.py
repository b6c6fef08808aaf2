"""normcert: property-based numerical certification of transformer-block kernels.

One import name; the repository's top-level folders are its subpackages:

    normcert.oracle      <- oracle/      exact semantics and the error model
    normcert.impls       <- impls/       the registry and the kernels under test
    normcert.properties  <- properties/  the suite in layers: what a kernel declares, the search, the
                                         harness, the families, the evidence, the run, the
                                         presentation, the suite a certify run collects, and
                                         normcert's own tests (its docstring draws them)

``normcert.cli`` is the ``normcert`` command (also ``python -m normcert``).
"""
from __future__ import annotations

import os
import subprocess
from importlib.metadata import PackageNotFoundError, version as _dist_version

try:
    __version__ = _dist_version("normcert")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "unknown"


def source_revision() -> str | None:
    """``git describe --always --dirty`` of normcert's own sources, or None.

    Only when this package is imported from a git checkout of normcert (an
    editable install): never the revision of whatever repository the user runs
    from, and None for a wheel install (``__version__`` identifies that).
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "pyproject.toml")) or not os.path.isdir(os.path.join(root, ".git")):
        return None
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True,
                             check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
