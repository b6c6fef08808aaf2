"""The calling contract (``families.contract``), and a kernel supports at least one dtype."""
from __future__ import annotations

import pytest

from ...oracle.formats import DTYPES

from ..run.outcomes import certify
from ..harness.probes import probe


@pytest.mark.normcert_family("contract")
def test_contract(normcert_session, normcert_family, impl, dtype):
    certify(normcert_session, normcert_family, impl, dtype)


def test_supports_some_dtype(normcert_session, impl):
    supported = [d for d in DTYPES if probe(normcert_session, impl, d)]
    assert supported, f"{impl.id} raises NotImplementedError for every dtype ({', '.join(map(str, DTYPES))})"
