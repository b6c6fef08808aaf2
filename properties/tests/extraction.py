"""The float64 oracle's two extraction paths, for the tests that run it on one or the other."""
from __future__ import annotations

from contextlib import contextmanager

import pytest

from ...oracle import native


def need_native():
    status = native.status()
    if not status.native:
        pytest.skip(f"the native kernels are unavailable: {status.reason}")


@contextmanager
def extraction(kind: str):
    """Run the float64 oracle on the native kernels (``"native"``) or on the pure torch path (``"pure"``)."""
    if kind == "pure":
        with native.pure():
            yield
        return
    need_native()
    yield
