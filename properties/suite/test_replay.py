"""``pytest --replay FILE``: re-run one saved failing case (collected only then).

The case comes back bit for bit from the file; the implementation is the one
given with --impl, or the one the file names if that is in the registry or is
normcert's own code (``plugin._replay_target``: a file never picks what runs).  Exit status 1 if the property
still fails, 0 if it holds.  Needs no Hypothesis database.
"""
from __future__ import annotations

import pytest

from ..families import BY_NAME
from ..harness.measure import Worst


def test_replay(normcert_session, record_property):
    meta, case = normcert_session.replay
    impl = normcert_session.replay_impl
    check = BY_NAME[meta["property"]].check
    print(f"replaying {meta['property']} for {impl.id} on {case.describe()}")
    try:
        check(normcert_session, impl, case, Worst())
    except AssertionError as e:
        record_property("normcert-replay", "fail")  # the run's verdict reads this, not pytest's report
        # from None: pytest would print the AssertionError again as the failure's context
        raise pytest.fail.Exception(f"{meta['property']} still fails for {impl.id}: {e}", pytrace=False) from None
    record_property("normcert-replay", "pass")
