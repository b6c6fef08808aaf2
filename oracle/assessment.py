"""The assessment: one kernel output against the exact value under the error model's bound.

``assess`` checks an output element by element: NaN must be NaN, an infinite exact value the same
inf, a finite one within its bound; it reports the worst error in ulps of the output dtype and in
model units (error / bound; <= 1 passes).  ``pair_reference`` turns another kernel's output into a
reference and bound for the same check (two kernels that must agree, e.g. fused and unfused).
The bounds themselves are the error model's (``error_model`` and the ``bounds_*`` modules).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .formats import fmt, to_float64


@dataclass
class Assessment:
    name: str
    ok: bool
    unclaimed: int
    max_ulps: float
    max_units: float
    detail: str  # the worst element, or the first class mismatch
    exact: int = 0  # quantised outputs: elements equal to the exact value rounded (bit-exact) ...
    checked: int = 0  # ... of this many claimed finite ones
    elements: dict | None = None  # a failing output's per-element data (``worst_elements``); None where it passes
    failure: str = ""  # what is wrong at the element ``detail`` names: "NaN pattern", "infinity" or
    #                    "over the bound" ("" where the output passes): a failure's kind (``runner``)


TOP_K = 8
"""The elements a failure's ``worst_elements`` lists: the largest error / bound, those over the bound first."""

WINDOW = 256
"""The most elements of the failing row ``worst_elements`` keeps, a window around the worst column."""


def worst_elements(kind: str, name: str, form: str, at: tuple, got, ref, bound, units, ulps, over, checked: int,
                   rank=None) -> dict:
    """A failing output's per-element data, for the report's card (``properties/report_replay``) by
    way of the replay file: plain numbers, JSON-ready (non-finite ones stay floats).

    ``kind`` "oracle": ``got`` against the exact value ``ref`` under ``bound``, with ``units``
    (error / bound) and ``ulps`` as ``assess`` computed them ("pair" where ``ref`` is another call's
    output, ``pair_reference``; ``measure.check_pair`` renames it); "agreement": ``got`` against the
    other kernel's ``ref``, ``ulps`` the steps of the format between them (bound 0: the bits must
    match).  ``over``: the elements that fail; ``at``: the worst element's index.  Keeps the
    ``TOP_K`` elements of the whole output ranked by ``rank`` (default ``units``; NaN as inf),
    those in ``over`` first, and the values of the failing row (``at``'s, along the last dim) in a
    window of at most ``WINDOW`` columns around ``at``."""
    shape = tuple(np.shape(ref))
    arrays = [np.broadcast_to(np.asarray(v, dtype=np.float64), shape).reshape(shape or (1,))
              for v in (got, ref, bound, units, ulps)]
    over = np.broadcast_to(np.asarray(over, dtype=bool), shape).reshape(shape or (1,))
    at = tuple(at) or (0,)
    score = np.abs(np.nan_to_num(np.broadcast_to(np.asarray(units if rank is None else rank, dtype=np.float64),
                                                 shape).reshape(over.shape), nan=np.inf, posinf=np.inf))
    with np.errstate(all="ignore"):  # over the bound: [1, inf]; within it: [0, 1)
        score = np.where(over, 1 + score, np.where(np.isinf(score), 1.0, score / (1 + score))).ravel()
    k = min(TOP_K, score.size)
    top = np.argpartition(-score, k - 1)[:k] if k else np.zeros(0, int)
    top = sorted(top.tolist(), key=lambda j: (-score[j], j))
    flat = [v.ravel() for v in arrays]
    rows = [{"index": [int(i) for i in np.unravel_index(j, over.shape)], "got": float(flat[0][j]),
             "exact": float(flat[1][j]), "bound": float(flat[2][j]), "units": float(flat[3][j]),
             "ulps": float(flat[4][j]), "over": bool(over.ravel()[j])} for j in top]
    n = over.shape[-1]
    start = min(max(at[-1] - WINDOW // 2, 0), max(n - WINDOW, 0))
    stop = min(start + WINDOW, n)
    line = lambda v: [float(x) for x in v[at[:-1]][start:stop]]  # noqa: E731
    return {"kind": kind, "output": name, "format": form, "shape": list(shape), "index": list(at),
            "over": int(over.sum()), "checked": int(checked), "top": rows,
            "row": {"index": list(at[:-1]), "length": int(n), "start": int(start),
                    "got": line(arrays[0]), "exact": line(arrays[1]), "bound": line(arrays[2]),
                    "units": line(arrays[3]), "ulps": line(arrays[4]),
                    "over": [bool(x) for x in over[at[:-1]][start:stop]]}}


def _format(dtype_or_format):
    """The format an output is checked in: a dtype's (``formats.fmt``) or one given (``formats.UE8M0``)."""
    return fmt(dtype_or_format) if isinstance(dtype_or_format, torch.dtype) else dtype_or_format


def pair_reference(y0: torch.Tensor, tol: np.ndarray, quantised: bool = False, form=None):
    """(reference, bound) for checking an output y1 against another kernel output y0 that is
    within ``tol`` of it before any rounding: ``assess(name, y1, reference, bound, ...)``.

    A quantised y0 stands for any value that rounds to it, its ``rounding_interval`` [lo, hi]:
    the reference is its centre and the bound grows by its half-width, so y1 passes iff some
    value within tol of that interval rounds to it.  At ±max of a saturating format the interval
    is cut at ±2 max: nothing past max rounds otherwise, so no verdict changes.  A tol of -inf
    (no claim on that element) is a bound of -inf, whatever y0 is."""
    r = to_float64(y0)
    if not quantised:
        return r, tol
    f = _format(form if form is not None else y0.dtype)
    lo, hi = f.rounding_interval(r)
    lo, hi = np.maximum(lo, -2 * f.max), np.minimum(hi, 2 * f.max)
    with np.errstate(all="ignore"):
        return np.where(np.isnan(r), r, (lo + hi) / 2), np.where(tol == -np.inf, -np.inf, (hi - lo) / 2 + tol)


def _needed(f, a, e):
    """How far from the exact value e a kernel's value must have been to round to a: the distance
    from e to a's ``rounding_interval`` (0 where e rounds to a)."""
    lo, hi = f.rounding_interval(a)
    with np.errstate(all="ignore"):
        return np.maximum(np.maximum(lo - e, e - hi), 0.0)


def assess(name: str, actual: torch.Tensor, exact: np.ndarray, bound: np.ndarray, dtype,
           where: np.ndarray | None = None, nan_ok: np.ndarray | None = None, quantised: bool = False) -> Assessment:
    """Check one output: NaN must be NaN, ±inf the same inf, finite within bound.  ``dtype``: the
    output's dtype, or the format it is stored in where that is not a dtype's (UE8M0 scales).

    An inf is accepted where a value within the bound reaches the largest finite number of the
    output dtype with that sign (e + bound >= max for +inf, e - bound <= -max for -inf): that is
    what rounding such a value does, whatever the sign of e itself (a cancelling dx whose bound
    passes float16's range may come back as either inf).  ``where`` limits the check to a mask;
    at ``nan_ok`` (the op record's ``indeterminate``) NaN is accepted for an infinite exact value.

    A bound of -inf marks an element outside the model's contract whatever its exact value: its
    row overflows the compute format (``error_model``: no claim), and an infinite exact value there
    (a gated norm's r s past float64's range) is not claimed either, as a finite one is not at +inf.

    ``quantised`` (``record.Op.quantised``): the output is the kernel's value rounded once to
    ``dtype``, and ``bound`` is on that value: the output passes iff a value within bound of the
    exact one rounds to it, i.e. it lies in [RNE(e - bound), RNE(e + bound)]; an infinite exact
    value must give RNE(e) (±max: the format saturates).  Its model units are that value's
    distance from e over the bound; its ulps are steps of ``dtype`` from RNE(e); and it counts
    the outputs equal to RNE(e), bit-exact.  A bound of 0 says the kernel's value before its
    rounding is e itself (``lattice``: every correct order forms it exactly), so the output must be
    RNE(e) alone: where e is a tie, the even neighbour, not both ends of its closed interval.
    """
    f = _format(dtype)
    a = to_float64(actual).reshape(exact.shape)
    e = exact
    sel = np.ones(e.shape, bool) if where is None else np.broadcast_to(where, e.shape)
    claimed = sel & np.isfinite(bound) | sel & ~np.isfinite(e) & (bound != -np.inf)
    unclaimed = int((sel & ~claimed).sum())
    with np.errstate(all="ignore"):
        nan_e, nan_a = np.isnan(e), np.isnan(a)
        bad_nan = claimed & (nan_e != nan_a)
        inf_e = np.isinf(e)
        fin = claimed & np.isfinite(e)
        if quantised:
            q = f.round(e)
            bad_inf = claimed & inf_e & ~(a == q)
            err = np.where(np.isnan(a), np.inf, _needed(f, a, e))
            err = np.where((bound == 0) & fin & (a != q), np.maximum(err, np.abs(a - e)), err)  # a tie's odd end
            overflow_ok = np.zeros(e.shape, bool)
            ulps = np.where(fin & np.isfinite(a), np.abs(f.rank(a) - f.rank(q)), 0.0)  # steps of the format
        else:
            bad_inf = claimed & inf_e & ~(a == e)
            err = np.abs(a - e)
            overflow_ok = fin & np.isinf(a) & np.where(a > 0, e + bound >= f.max, e - bound <= -f.max)
            ulps = np.where(fin & ~overflow_ok & np.isfinite(err), err / f.ulp(e), 0.0)
        if nan_ok is not None:
            excused = np.broadcast_to(nan_ok, e.shape) & inf_e & nan_a
            bad_nan, bad_inf = bad_nan & ~excused, bad_inf & ~excused
        bad_fin = fin & ~overflow_ok & ~(err <= bound)
        units = np.where(fin & ~overflow_ok & np.isfinite(err), err / np.where(bound > 0, bound, np.inf), 0.0)
        units = np.where(fin & ~overflow_ok & (err > 0) & (bound == 0), np.inf, units)
        units = np.where(fin & ~overflow_ok & ~np.isfinite(err), np.inf, units)
    bad = bad_nan | bad_inf | bad_fin
    max_ulps = float(ulps.max(initial=0.0)) if not np.isinf(units).any() else float(np.where(np.isfinite(ulps), ulps, 0).max(initial=0))
    detail, elements, failure = "", None, ""
    rounds = (lambda i: f" (rounds to {float(q[i])!r})") if quantised else (lambda i: "")
    what = "the value rounded is off by" if quantised else "|error|"
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        if bad_fin.any():
            idx = tuple(int(i) for i in np.unravel_index(np.argmax(np.where(bad_fin, units, -1)), e.shape))
        detail = f"{name}{list(idx)}: got {float(a[idx])!r}, exact {float(e[idx])!r}{rounds(idx)}"
        failure = ("NaN pattern" if nan_a[idx] != nan_e[idx] else "infinity" if np.isinf(a[idx]) or inf_e[idx]
                   else "over the bound")
        if not (quantised and not bad_fin[idx]):  # a quantised NaN / saturation mismatch: no distance to give
            detail += f", {what} {err[idx]:.3g} > bound {bound[idx]:.3g} ({ulps[idx]:.3g} ulp of {f.name})"
        past = np.where(bad & ~bad_fin, np.inf, units)  # a NaN or inf where the exact value is not: past any bound
        elements = worst_elements("oracle", name, f.name, idx, a, e, bound, past, ulps, bad, int(claimed.sum()))
    elif fin.any():
        idx = tuple(int(i) for i in np.unravel_index(np.argmax(units), e.shape))
        detail = f"{name}{list(idx)}: worst {what} {err[idx]:.3g} = {units[idx]:.3g} of bound, {ulps[idx]:.3g} ulp"
    hits = int((fin & (a == q)).sum()) if quantised else 0
    return Assessment(name, not bad.any(), unclaimed, max_ulps, float(units.max(initial=0.0)), detail,
                      hits, int(fin.sum()) if quantised else 0, elements, failure)
