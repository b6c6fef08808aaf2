"""Developing normcert itself: the suite's own plugin (``normcert.properties.run.plugin``,
loaded through its ``pytest11`` entry point) does the work; this file only makes
sure that a run from the clone tests the clone.
"""
from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    here = os.path.dirname(os.path.abspath(__file__))
    try:  # the subpackages too: `normcert` itself may come from the current folder, the rest from an install
        import normcert.properties  # noqa: PLC0415
    except ImportError:
        raise pytest.UsageError('normcert is not installed: run  pip install -e ".[test]"  in this clone') from None
    for module, folder in ((normcert, "normcert"), (normcert.properties, "properties")):
        found = os.path.dirname(os.path.abspath(module.__file__))
        if found != os.path.join(here, folder):
            raise pytest.UsageError(f"{module.__name__} is imported from {found}, not from this clone ({here}): "
                                    f'run  pip install -e ".[test]"  here')
