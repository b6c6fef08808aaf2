"""The measurement: a kernel's outputs against the oracle (or against its own other call) under
the error model's bound, and the worst error a run has seen.

A check measures each output with ``check_against_oracle`` or ``check_pair``; each assessment is
kept in the run's ``Worst`` (which Hypothesis climbs) and raises ``PropertyFailure`` past the bound.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import oracle
from ..oracle import assessment

from .case import Case


class PropertyFailure(AssertionError):
    """A property does not hold for the kernel on some case."""



@dataclass
class Worst:
    """The worst error a run has seen, in model units and in ulps, and where."""

    units: float = 0.0
    ulps: float = 0.0
    where: str = ""
    unclaimed: int = 0
    example_units: float = 0.0  # worst of the current example: what Hypothesis climbs
    exact: int = 0  # quantised outputs checked against the oracle: bit-exact ones ...
    checked: int = 0  # ... of these

    def add(self, a: assessment.Assessment, case: Case) -> None:
        self.unclaimed += a.unclaimed
        if np.isfinite(a.max_units):
            self.example_units = max(self.example_units, a.max_units)
        self.ulps = max(self.ulps, a.max_ulps)
        if a.max_units >= self.units:
            self.units = a.max_units
            self.where = f"{a.detail} on {case.describe()}"


def oracle_assessments(outs, case: Case, where=None, label=""):
    """Each output's ``(assessment, exact, bound)`` against the oracle under the error model's bound
    (``benchmarks/tightness.py`` reads the bounds themselves)."""
    args = case.oracle_args()
    exact = oracle.forward(case.op, **args)
    rec = case.record
    bounds = rec.forward_bound(args, exact)
    nan_ok = rec.indeterminate(args) if rec.indeterminate else None
    for name, o, e, b in zip(rec.outputs, outs, exact, bounds):
        yield assessment.assess(label + name, o, e, b, rec.out_dtype(name, case.tensors), where=where, nan_ok=nan_ok,
                                quantised=rec.quantised_dtype(name) is not None), e, b


def check_against_oracle(outs, case: Case, worst: Worst, where=None, label="") -> None:
    """Every output within the error model's bound of the exact value."""
    for a, _, _ in oracle_assessments(outs, case, where, label):
        worst.exact, worst.checked = worst.exact + a.exact, worst.checked + a.checked
        record_assessment(a, case, worst)


def check_pair(label: str, name: str, actual, other, tol, case: Case, worst: Worst, where=None) -> None:
    """Output ``name`` of one call (``actual``) within ``tol`` of another call's (``other``), tol
    bounding how far apart the two may be before any rounding to a quantised format
    (``assessment.pair_reference``)."""
    rec = case.record
    quantised = rec.quantised_dtype(name) is not None
    ref, bound = assessment.pair_reference(other, tol, quantised)
    a = assessment.assess(label, actual, ref, bound, rec.out_dtype(name, case.tensors), where=where,
                           quantised=quantised)
    record_assessment(a, case, worst)


def record_assessment(a: assessment.Assessment, case: Case, worst: Worst) -> None:
    worst.add(a, case)
    if not a.ok:
        raise PropertyFailure(a.detail)
