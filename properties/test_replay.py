"""``pytest --replay FILE``: re-run one saved failing case (collected only then).

The case comes back bit for bit from the file; the implementation is the one
given with --impl, or the one the file names if that is in the registry or is
normcert's own code (``plugin._replay_target``: a file never picks what runs).  Exit status 1 if the property
still fails, 0 if it holds.  Needs no Hypothesis database.
"""
from __future__ import annotations

import importlib

import pytest

from normcert.properties import CHECKS
from normcert.properties.harness import CONFIG, Worst


def test_replay():
    meta, case = CONFIG["replay"]
    impl = CONFIG["replay_impl"]
    module, _, fn = CHECKS[meta["property"]].partition(":")
    check = getattr(importlib.import_module(module), fn)
    print(f"replaying {meta['property']} for {impl.id} on {case.describe()}")
    try:
        check(impl, case, Worst())
    except AssertionError as e:
        pytest.fail(f"{meta['property']} still fails for {impl.id}: {e}", pytrace=False)
