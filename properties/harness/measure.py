"""The measurement: a kernel's outputs against the oracle (or against its own other call) under
the error model's bound, and the worst error a run has seen.

A check measures each output with ``check_against_oracle`` or ``check_pair``; each assessment is
kept in the run's ``Worst`` (which Hypothesis climbs) and raises ``PropertyFailure`` past the bound.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import oracle
from ...oracle import assessment
from ...oracle.bounds_quant import rescaled
from ...oracle.formats import to_float64
from ...oracle.fp4 import divisor

from ..search.case import Case


class PropertyFailure(AssertionError):
    """A property does not hold for the kernel on some case.  ``kind``: which failure this is, where
    the raiser knows (an output's name and its ``Assessment.failure``), for telling distinct
    failures of one cell apart (``runner.kind_of``); ``units`` and ``ulps``: the failing
    assessment's worst error / bound and ulps, where one was measured."""

    def __init__(self, message: str = "", kind: str = "", units: float | None = None, ulps: float | None = None):
        super().__init__(message)
        self.kind, self.units, self.ulps = kind, units, ulps


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
    (``benchmarks/tightness.py`` reads the bounds themselves).  An output divided by the kernel's
    own scale (``record.Out.scale``) is checked against v over that scale, after the scale itself."""
    args = case.oracle_args()
    exact = list(oracle.forward(case.op, **args))
    rec = case.record
    pairs = [(rec.outputs.index(n), rec.outputs.index(s)) for n, s in rec.scaled.items()]  # at most one
    kw = {"kernel_scale": to_float64(outs[j]) for _, j in pairs}
    bounds = rec.forward_bound(args, tuple(exact), **kw)
    for i, j in pairs:  # the scale y was divided by: rounded where the scale's format rounds (UE8M0,
        name = rec.outputs[j]  # E4M3; an FP4 scale that rounds to 0 is not a divisor: ``fp4.divisor``)
        used = divisor(exact[j], rec.out_format(name, args)) if rec.is_quantised(name, args) else exact[j]
        out = rec.outs[j]  # per group: the group's size, so a partial last group is spread right
        exact[i] = rescaled(exact[i], used, kw["kernel_scale"], rec.group_size(out, args) if out.shape == "groups" else None)
    order = [j for _, j in pairs] + [k for k in range(len(rec.outputs)) if k not in {j for _, j in pairs}]
    nan_ok = rec.indeterminate(args) if rec.indeterminate else None
    for k in order:
        name, e, b = rec.outputs[k], exact[k], bounds[k]
        yield assessment.assess(label + name, outs[k], e, b, rec.out_format(name, args), where=_fit(where, e),
                                nan_ok=nan_ok, quantised=rec.is_quantised(name, args)), e, b


def check_against_oracle(outs, case: Case, worst: Worst, where=None, label="") -> None:
    """Every output within the error model's bound of the exact value."""
    for a, _, _ in oracle_assessments(outs, case, where, label):
        worst.exact, worst.checked = worst.exact + a.exact, worst.checked + a.checked
        record_assessment(a, case, worst)


def check_pair(label: str, name: str, actual, other, tol, case: Case, worst: Worst, where=None) -> None:
    """Output ``name`` of one call (``actual``) within ``tol`` of another call's (``other``), tol
    bounding how far apart the two may be before any rounding to a quantised format
    (``assessment.pair_reference``)."""
    rec, args = case.record, case.oracle_args()
    quantised, form = rec.is_quantised(name, args), rec.out_format(name, args)
    ref, bound = assessment.pair_reference(other, tol, quantised, form)
    a = assessment.assess(label, actual, ref, bound, form, where=_fit(where, ref), quantised=quantised)
    if a.elements is not None:  # measured against another call's output, not the exact value
        a.elements["kind"] = "pair"
    record_assessment(a, case, worst)


def _fit(where, exact):
    """A mask of the row outputs' shape (or a keepdims one) for an output of any shape: a per-row
    output (one value per row, ``record.Out.shape``) takes its leading dims, a per-group one
    (rows x groups) a row's mask for each of its groups (a row's mask is the same along it)."""
    if where is None:
        return where
    where = np.asarray(where)
    if where.ndim != np.ndim(exact):
        return where[..., 0]
    return where if where.ndim == 0 or where.shape[-1] in (1, np.shape(exact)[-1]) else where[..., :1]


def record_assessment(a: assessment.Assessment, case: Case, worst: Worst) -> None:
    worst.add(a, case)
    if not a.ok:
        case.elements = a.elements  # the replay file keeps them for the report's card
        raise PropertyFailure(a.detail, kind=f"{a.name}: {a.failure}", units=a.max_units, ulps=a.max_ulps)
