"""Gradients against the oracle's VJP (``families.gradients``), and torch's gradcheck in float64
(``families.gradcheck``)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify, certify_gradcheck


@pytest.mark.normcert_family("gradients")
def test_gradients(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)


@pytest.mark.normcert_family("gradcheck")
def test_gradcheck(normcert_session, normcert_family, impl):
    certify_gradcheck(normcert_session, normcert_family, impl)
