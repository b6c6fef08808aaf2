"""Invariance under the op's symmetries (``families.invariance``)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify


@pytest.mark.normcert_family("invariance")
def test_invariance(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)
