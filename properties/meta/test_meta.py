"""The suite's teeth: planted bugs must be rejected, correct variants certified.

* every kernel in ``planted.BUGS`` fails at least one property of the families
  listed beside it, with a message naming the property, dtype and shrunk case;
* every kernel in ``planted.CORRECT`` passes every property in every dtype
  (``--meta-seeds K`` repeats that under K different global seeds; default 1).

Each runs the property checks in-process through ``harness.run`` -- the same
code path as the main tests -- so a property that cannot fail shows up here.
"""
from __future__ import annotations

import importlib
import inspect

import pytest

from normcert.impls import make
from normcert.oracle.formats import DTYPES
from normcert.properties import CHECKS, harness
from normcert.properties.harness import PropertyFailure

from . import planted
from .. import strategies
from ..opinfo import INFO

# Property -> (test module, strategy factory) for in-process runs; each factory
# is the one the property's own test uses.
PROPERTY_ORDER = ("contract", "accuracy", "extremes", "fusion", "padding", "row-independence", "invariance",
                  "gradients", "determinism", "batch-invariance")
DTYPE_ORDER = (DTYPES[3], DTYPES[2], DTYPES[1], DTYPES[0])  # bf16, fp16, fp32, fp64: bugs show soonest in low precision


def _strategy(prop, op, dtype):
    dev = harness.CONFIG["device"]
    from .. import test_bitwise, test_gradients, test_invariance, test_masks  # noqa: PLC0415

    return {
        "accuracy": lambda: strategies.cases(op, dtype, dev, profiles=("normal", "lattice", "offset", "constant"),
                                             hostile=False),
        "extremes": lambda: strategies.cases(op, dtype, dev, profiles=strategies.EXTREME, hostile=True),
        "contract": lambda: strategies.cases(op, dtype, dev, profiles=("normal", "lattice"), hostile=False),
        "fusion": lambda: strategies.cases(op, dtype, dev, profiles=("normal", "lattice", "offset"), hostile=True),
        "padding": lambda: test_masks.padded_cases(dtype, dev),
        "row-independence": lambda: test_masks.row_cases(op, dtype, dev),
        "invariance": lambda: test_invariance.invariance_cases(op, dtype, dev),
        "gradients": lambda: test_gradients.gradient_cases(op, dtype, dev),
        "determinism": lambda: strategies.cases(op, dtype, dev, profiles=("normal", "lattice"), hostile=False),
        "batch-invariance": lambda: test_bitwise.batch_cases(op, dtype, dev),
    }[prop]()


def _applies(prop, op):
    info = INFO[op]
    return {"fusion": op == "add_rms_norm", "padding": op == "batch_norm",
            "row-independence": info.rowwise, "batch-invariance": info.rowwise,
            "invariance": info.scale_invariant or info.shift_invariant}.get(prop, True)


def _check(prop):
    module, _, fn = CHECKS[prop].partition(":")
    return getattr(importlib.import_module(module), fn)


def _impl(op, fn, backend="plugin"):
    return make(op, fn.__name__, backend, fn, target=f"normcert.properties.meta.planted:{fn.__name__}")


def _first_failure(impl, props, max_examples):
    for prop in PROPERTY_ORDER:
        if prop not in props or not _applies(prop, impl.op):
            continue
        for dtype in DTYPE_ORDER:
            try:
                res = harness.run(prop, impl, dtype, _strategy(prop, impl.op, dtype), _check(prop),
                                  max_examples=max_examples)
            except PropertyFailure as e:
                return prop, str(e)
            if res.outcome == "not-supported":
                continue
    return None, None


@pytest.mark.parametrize("op, fn, families", planted.BUGS, ids=[f.__name__ for _, f, _ in planted.BUGS])
def test_planted_bug_is_rejected(op, fn, families, tmp_path, monkeypatch):
    monkeypatch.setitem(harness.CONFIG, "failures_dir", str(tmp_path))
    monkeypatch.setitem(harness.CONFIG, "bitwise", True)
    prop, message = _first_failure(_impl(op, fn), families, max_examples=40)
    assert prop is not None, f"planted bug {fn.__name__} ({inspect.getdoc(fn) or op}) survived {sorted(families)}"
    assert prop in message and "shrunk case" in message and "replay: normcert replay " in message
    print(f"{fn.__name__}: rejected by {prop}: {message.splitlines()[0]}")


@pytest.mark.parametrize("op, fn", planted.CORRECT, ids=[f.__name__ for _, f in planted.CORRECT])
def test_correct_variant_is_certified(op, fn, tmp_path, monkeypatch, request):
    monkeypatch.setitem(harness.CONFIG, "failures_dir", str(tmp_path))
    impl = _impl(op, fn)
    for k in range(request.config.getoption("--meta-seeds")):
        monkeypatch.setitem(harness.CONFIG, "seed", harness.CONFIG["seed"] + 1000 * k)
        for prop in PROPERTY_ORDER[:8]:  # the bitwise pair is not a correctness claim
            if not _applies(prop, op):
                continue
            for dtype in DTYPES:
                harness.run(prop, impl, dtype, _strategy(prop, op, dtype), _check(prop))
