"""Accuracy and extremes: every output within the error model's bound of the oracle.

* accuracy  ordinary values, |mean| >> std rows and constant rows, every layout
* extremes  near-max, subnormal, zero, wide-range values and hostile rows
            holding NaN / ±inf: NaN and inf must come out where the oracle
            says, finite results may not overflow to inf or flush to 0, and
            add_rms_norm's residual must equal the rounded sum bit for bit.

The accuracy family draws each case's calling context too (``search.context``: grad mode, which
inputs require grad, default dtype, calling thread, state between calls (parameters written as
loaders and optimizers write them, or replaced), autocast, torch's thread count, parameters held as
tensors or ``nn.Parameter`` objects, deterministic algorithms), and holds the forward to the oracle
in each; extremes calls as tested.
"""
from __future__ import annotations

from hypothesis import strategies as st

from ..harness.calling import called, held_to, naming
from ..harness.measure import check_against_oracle
from ..search.case import valid_positions
from ..search.context import AS_TESTED, contexts
from ..search.strategies import EXTREME, cases

DRAWN = ("grad", "requires", "dtype", "thread", "state", "autocast", "threads", "held", "deterministic")
"""The context fields the accuracy family draws (``search.context``)."""


def check_accuracy(session, impl, case, worst):
    """The outputs of the kernel called on ``case`` in its context are within the bound of the oracle
    of the case's values."""
    with naming(impl, case, AS_TESTED):
        outs, _, _ = called(session, impl, case)
        check_against_oracle(tuple(o.detach() for o in outs), held_to(case, outs), worst, where=valid_positions(case))


@st.composite
def contextual_cases(draw, op, dtype, device, bucket=None):
    """``accuracy_cases``, each with a drawn context (the fields ``DRAWN``, as tested first)."""
    case = draw(accuracy_cases(op, dtype, device, bucket=bucket))
    case.context = draw(contexts(case.record.grads_in(case.tensors), AS_TESTED, DRAWN, bucket))
    return case


def accuracy_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=("normal", "lattice", "offset", "constant"), hostile=False, bucket=bucket)


def extreme_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=EXTREME, hostile=True, bucket=bucket)
