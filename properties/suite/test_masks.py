"""Padding masks and row independence (``families.masks``)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify


@pytest.mark.normcert_family("padding")
def test_padding(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)


@pytest.mark.normcert_family("row-independence")
def test_row_independence(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)
