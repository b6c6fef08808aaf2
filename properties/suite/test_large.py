"""Large: the sizes where int32 offsets and grid limits break (``families.large``; ``--profile large``, on a GPU)."""
from __future__ import annotations

import pytest

from ..run.outcomes import certify_large


@pytest.mark.normcert_family("large")
def test_large(normcert_session, normcert_family, impl, dtype):
    certify_large(normcert_session, normcert_family, impl, dtype)
