"""Bitwise reproducibility, gating only with --bitwise (``families.bitwise``)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify


@pytest.mark.normcert_family("determinism")
def test_determinism(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)


@pytest.mark.normcert_family("batch-invariance")
def test_batch_invariance(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)
