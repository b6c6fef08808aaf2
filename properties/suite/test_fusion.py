"""Residual fusion (``families.fusion``)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify


@pytest.mark.normcert_family("fusion")
def test_fusion(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)
