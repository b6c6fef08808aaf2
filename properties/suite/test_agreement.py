"""Two kernels of one op that must give the same bits, ``--agree`` (``families.agreement``)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify


@pytest.mark.normcert_family("agreement")
def test_agreement(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)
