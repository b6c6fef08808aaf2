"""The compiled family (``families.compiled``): a torch operator's registration and compiled calls."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify


@pytest.mark.normcert_family("compiled")
def test_compiled(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)
