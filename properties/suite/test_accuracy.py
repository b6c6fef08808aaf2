"""Accuracy and extremes (``families.accuracy``)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify


@pytest.mark.normcert_family("accuracy")
def test_accuracy(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)


@pytest.mark.normcert_family("extremes")
def test_extremes(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)
