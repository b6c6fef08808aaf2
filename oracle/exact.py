"""The exact slow paths: sums, dot products and centring that are exact by construction.

The float64 backend falls back on these for the rows its certificate does not
cover; they are slow (Python integers, or a loop of numpy passes) and exact.

Python integers: every finite binary64 v is m 2**(x - 1126) with integers
m < 2**53 and x >= 0 (``_int_of``), so sum_i a_i and sum_i a_i b_i are
integers times 2**-1126 and 2**-2252, computed exactly; Python's int / int is
correctly rounded, so each result is rounded exactly once, to nearest-even.

``exact_sums`` (finite rows whose sigma fits in float64): extraction
(``eft.extract``'s maths, in numpy) is repeated on the remainders until they
are zero.  Each pass leaves |r| <= 2**(G - 52) max|r| with G = bit_length(n + 1),
and each pass's tau is exact, so sum a = the sum of the taus exactly;
``math.fsum`` rounds that sum of floats once.
"""
from __future__ import annotations

import math

import numpy as np

from .eft import exps, pow2


def _int_of(v: float) -> tuple[int, int]:
    """v == m * 2**(x - 1126) with integers m, x >= 0."""
    mant, ex = math.frexp(v)
    return int(mant * 9007199254740992.0), ex + 1073


def _int_to_float(num: int, shift: int, den: int = 1) -> float:
    """num / (den 2**shift) rounded to nearest-even (Python's int division is correctly rounded)."""
    try:
        return num / (den << shift)
    except OverflowError:
        return math.inf if num > 0 else -math.inf


def py_sum(vals) -> float:
    """RN(sum vals) for finite floats, with Python integers."""
    tot = 0
    for v in vals:
        m, x = _int_of(v)
        tot += m << x
    return _int_to_float(tot, 1126)


def py_dot(xs, ys) -> float:
    """RN(sum x_i y_i) for finite floats, with Python integers."""
    tot = 0
    for x, y in zip(xs, ys):
        mx, ex = _int_of(x)
        my, ey = _int_of(y)
        tot += (mx * my) << (ex + ey)
    return _int_to_float(tot, 2252)


def py_center(vals) -> tuple[list[float], float]:
    """(RN(a_i - m) for each i, RN(m)), m the exact mean, with Python integers."""
    ints = [_int_of(v) for v in vals]
    n = len(ints)
    tot = sum(m << x for m, x in ints)
    d = [_int_to_float(n * (m << x) - tot, 1126, n) for m, x in ints]
    return d, _int_to_float(tot, 1126, n)


def exact_sums(a: np.ndarray) -> np.ndarray:
    """Correctly rounded sums of the rows of a 2-D float64 array.

    Extraction is repeated on the remainder until it is zero; every partial
    sum is exact, and ``math.fsum`` rounds their total once.  Rows so large
    that sigma would overflow are summed with Python integers; rows holding
    a non-finite value are summed in plain IEEE arithmetic.
    """
    rows, n = a.shape
    out = np.zeros(rows)
    if n == 0 or rows == 0:
        return out
    grid = (n + 1).bit_length()
    with np.errstate(all="ignore"):
        m = np.max(np.abs(a), axis=1)
        nonfin = ~np.isfinite(m)
        out[nonfin] = a[nonfin].sum(axis=1)
        big = ~nonfin & (exps(m) + grid > 1022)
        for i in np.flatnonzero(big):
            out[i] = py_sum(a[i].tolist())
        rest = ~(nonfin | big)
        r = a[rest].copy()
        taus = []
        # each pass leaves |r| <= 2**(grid - 52) max|r|: from 2**1022 to 0 in a bounded number
        for _ in range(2 + 2100 // (52 - grid)):
            m = np.max(np.abs(r), axis=1, keepdims=True) if r.size else r
            if not m.any():
                break
            sigma = pow2(exps(m) + grid)
            q = (sigma + r) - sigma  # on the grid 2**(k-53): their float sum is exact
            r -= q  # exact
            taus.append(q.sum(axis=1))
        else:
            raise AssertionError("exact summation did not terminate")
    if taus:
        out[rest] = [math.fsum(col) for col in zip(*(t.tolist() for t in taus))]
    return out
