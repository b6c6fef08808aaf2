"""Accuracy and extremes: every output within the error model's bound of the oracle.

* accuracy  ordinary values, |mean| >> std rows and constant rows, every layout
* extremes  near-max, subnormal, zero, wide-range values and hostile rows
            holding NaN / ±inf: NaN and inf must come out where the oracle
            says, finite results may not overflow to inf or flush to 0, and
            add_rms_norm's residual must equal the rounded sum bit for bit.
"""
from __future__ import annotations

from ..search.case import valid_positions
from ..harness.measure import check_against_oracle
from ..harness.sandbox import invoke
from ..search.strategies import EXTREME, cases


def check_accuracy(session, impl, case, worst):
    outs = invoke(session, impl, case)
    check_against_oracle(outs, case, worst, where=valid_positions(case))


def accuracy_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=("normal", "lattice", "offset", "constant"), hostile=False, bucket=bucket)


def extreme_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=EXTREME, hostile=True, bucket=bucket)
