"""``pytest --replay FILE``: re-run one saved failing case (collected only then).

The case comes back bit for bit from the file; the implementation is the one
the file names, or the one given with --impl.  Exit status 1 if the property
still fails, 0 if it holds.  Needs no Hypothesis database.
"""
from __future__ import annotations

import importlib

import pytest

from normcert import impls
from normcert.properties import CHECKS
from normcert.properties.harness import CONFIG, Worst


def _implementation(meta):
    plugged = [i for i in CONFIG["impls"] if i.backend == "plugin" and i.op == meta["op"]]
    return plugged[0] if plugged else impls.plugin(meta["impl"])


def test_replay():
    meta, case = CONFIG["replay"]
    impl = _implementation(meta)
    module, _, fn = CHECKS[meta["property"]].partition(":")
    check = getattr(importlib.import_module(module), fn)
    print(f"replaying {meta['property']} for {impl.id} on {case.describe()}")
    try:
        check(impl, case, Worst())
    except AssertionError as e:
        pytest.fail(f"{meta['property']} still fails for {impl.id}: {e}", pytrace=False)
