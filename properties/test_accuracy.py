"""Accuracy and extremes: every output within the error model's bound of the oracle.

* accuracy  ordinary values, |mean| >> std rows and constant rows, every layout
* extremes  near-max, subnormal, zero, wide-range values and hostile rows
            holding NaN / ±inf: NaN and inf must come out where the oracle
            says, finite results may not overflow to inf or flush to 0, and
            add_rms_norm's residual must equal the rounded sum bit for bit.
"""
from __future__ import annotations

from .harness import CONFIG, check_against_oracle, certify, invoke
from .strategies import EXTREME, cases


def valid_positions(case):
    """batch_norm checks only positions where the mask is True."""
    m = case.tensors.get("mask")
    return None if m is None else m.cpu().numpy()[..., None]


def check_accuracy(impl, case, worst):
    outs = invoke(impl, case)
    check_against_oracle(outs, case, worst, where=valid_positions(case))


def test_accuracy(impl, dtype):
    strategy = cases(impl.op, dtype, CONFIG["device"], profiles=("normal", "lattice", "offset", "constant"),
                     hostile=False)
    certify("accuracy", impl, dtype, strategy, check_accuracy)


def test_extremes(impl, dtype):
    strategy = cases(impl.op, dtype, CONFIG["device"], profiles=EXTREME, hostile=True)
    certify("extremes", impl, dtype, strategy, check_accuracy)
