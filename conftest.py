"""Developing normcert itself: the suite's own plugin (``normcert.properties.plugin``,
loaded through its ``pytest11`` entry point) does the work; this file only makes
sure that a run from the clone tests the clone.
"""
from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    try:
        import normcert  # noqa: PLC0415
    except ImportError:
        raise pytest.UsageError('normcert is not installed: run  pip install -e ".[test]"  in this clone') from None
    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.dirname(os.path.dirname(os.path.abspath(normcert.__file__)))
    if installed != here:
        raise pytest.UsageError(f"normcert is imported from {installed}, not from this clone ({here}): "
                                f'run  pip install -e ".[test]"  here')
