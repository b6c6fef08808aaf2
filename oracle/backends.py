"""The two evaluation paths every oracle runs on.

Each op in ``oracle/`` is written once, against the small interface below, and
evaluated by either backend:

``MP``        numpy object arrays of ``mpmath.mpf`` at 256 bits.  Its own error
              is ~2**-250 relative: zero for every purpose here.  Slow; for
              small tensors and hostile inputs.
``F64``       numpy float64 whose reductions are exact: a row sum is computed
              by Rump's error-free extraction (each pass splits every element
              into a high part on a common grid, whose float sum is exact, and
              an exact remainder) and rounded once at the end; a signed dot
              product first splits every product into ``p + e`` exactly
              (Dekker); a mean square rounds each (non-negative) square once,
              so it is within 2u of exact.  Rows are pre-scaled by powers of
              two so nothing overflows.  There is no one-pass variance and no
              unscaled sum of squares anywhere; its own error is a few float64
              ulps, which the error model adds to every bound.

Interface (``a`` has rows along the last axis; results keep that axis as 1):

    B.array(a)            float64 ndarray -> backend array
    B.to_float64(a)       backend array -> float64 ndarray (rounded to nearest)
    B.row_sum(a)          sum_i a_i
    B.row_dot(a, b)       sum_i a_i b_i
    B.center(a)           (d, m): m = mean(a) and d = a - m, with d accurate to
                          a few ulps *of d* (not of m) even when |m| >> std(a)
    B.inv_rms(a, eps)     1 / sqrt(mean(a**2) + eps), never overflowing
    B.sqrt, B.exp         elementwise

NaN and ±Inf: rows holding a non-finite value are reduced in plain IEEE
arithmetic (``inf + -inf = nan``), which is what the exact value of the maths
is under IEEE conventions.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np

MP_PREC = 256


class _Float64Exact:
    name = "float64"

    def array(self, a):
        return np.array(a, dtype=np.float64)

    def to_float64(self, a):
        return np.asarray(a, dtype=np.float64)

    sqrt = staticmethod(np.sqrt)
    exp = staticmethod(np.exp)

    # ---- exact reductions -------------------------------------------------
    def row_sum(self, a):
        a = np.asarray(a, dtype=np.float64)
        return _exact_sum(a)

    def row_dot(self, a, b):
        a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
        n = a.shape[-1]
        if n == 0:
            return np.zeros(a.shape[:-1] + (1,))
        ka, kb = _row_exponent(a), _row_exponent(b)
        with np.errstate(all="ignore"):
            p, e = _two_prod(np.ldexp(a, -ka), np.ldexp(b, -kb))
            s = np.ldexp(_exact_sum(np.concatenate([p, e], axis=-1)), ka + kb)
            plain = np.sum(a * b, axis=-1, keepdims=True)
        finite = np.isfinite(a).all(axis=-1, keepdims=True) & np.isfinite(b).all(axis=-1, keepdims=True)
        return np.where(finite, s, plain)

    def center(self, a):
        a = np.asarray(a, dtype=np.float64)
        n = a.shape[-1]
        with np.errstate(all="ignore"):
            m1 = self.row_sum(a) / n
            d = a - m1
            c = self.row_sum(d) / n  # what rounding m1 and the subtraction left behind
            return d - c, m1 + c

    def inv_rms(self, a, eps):
        a = np.asarray(a, dtype=np.float64)
        n = a.shape[-1]
        scale = np.ldexp(1.0, -_row_exponent(a))  # a * scale has max |.| in [1/2, 1)
        with np.errstate(all="ignore"):
            sa = a * scale
            # squares are >= 0, so rounding each one costs at most u relative: no
            # cancellation can amplify it, and the sum itself is exact
            ms = self.row_sum(sa * sa) / n  # mean square of the scaled row
            # mean(a^2) + eps = (ms + eps * scale^2) / scale^2
            t = ms + eps * scale * scale
            r = scale / np.sqrt(t)
            direct = 1.0 / np.sqrt(ms / (scale * scale) + eps)
        return np.where(np.isfinite(r) & (r > 0), r, direct)


def _row_exponent(a):
    """k per row such that max |a| * 2**-k lies in [1/2, 1) (0 for all-zero rows)."""
    m = np.max(np.abs(np.where(np.isfinite(a), a, 0.0)), axis=-1, keepdims=True, initial=0.0)
    _, e = np.frexp(m)
    return e


def _two_prod(a, b):
    """p + e == a * b exactly (Dekker), for |a|, |b| <= 1."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def _split(a):
    c = 134217729.0 * a  # 2**27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _exact_sum(a):
    """Correctly rounded row sums of a float64 array (keepdims)."""
    n = a.shape[-1]
    if n == 0:
        return np.zeros(a.shape[:-1] + (1,))
    finite = np.isfinite(a).all(axis=-1, keepdims=True)
    r = np.where(finite, a, 0.0)
    taus = []
    grid = math.ceil(math.log2(n + 1)) + 1
    with np.errstate(all="ignore"):
        while True:
            m = np.max(np.abs(r), axis=-1, keepdims=True)
            if not np.any(m):
                break
            _, e = np.frexp(np.where(m > 0, m, 1.0))
            sigma = np.ldexp(1.0, np.minimum(e + grid, 1023))
            q = (sigma + r) - sigma  # on the grid ulp(sigma): their float sum is exact
            r = r - q  # exact
            taus.append(np.sum(q, axis=-1, keepdims=True))
        if not taus:
            total = np.zeros(a.shape[:-1] + (1,))
        else:
            stack = np.concatenate(taus, axis=-1).reshape(-1, len(taus))
            total = np.array([math.fsum(row) for row in stack.tolist()]).reshape(a.shape[:-1] + (1,))
        plain = np.sum(a, axis=-1, keepdims=True)
    return np.where(finite, total, plain)


class _MPExact:
    name = "mpmath"

    def array(self, a):
        a = np.asarray(a, dtype=np.float64)
        out = np.empty(a.shape, dtype=object)
        flat = out.reshape(-1)
        for i, v in enumerate(a.reshape(-1).tolist()):
            flat[i] = mpmath.mpf(v)
        return out

    def to_float64(self, a):
        a = np.asarray(a, dtype=object)
        return np.array([float(v) for v in a.reshape(-1)], dtype=np.float64).reshape(a.shape)

    def sqrt(self, a):
        return _elementwise(mpmath.sqrt, a)

    def exp(self, a):
        return _elementwise(mpmath.exp, a)

    def row_sum(self, a):
        return self._reduce(a, lambda row: mpmath.fsum(row))

    def row_dot(self, a, b):
        a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        return self._reduce(a * b, lambda row: mpmath.fsum(row))

    def center(self, a):
        m = self.row_sum(a) / a.shape[-1]
        return a - m, m

    def inv_rms(self, a, eps):
        ms = self.row_dot(a, a) / a.shape[-1]
        return 1 / self.sqrt(ms + mpmath.mpf(eps))

    @staticmethod
    def _reduce(a, fn):
        a = np.asarray(a, dtype=object)
        rows = a.reshape(-1, a.shape[-1]) if a.size else np.empty((int(np.prod(a.shape[:-1])), 0), object)
        with mpmath.workprec(MP_PREC):
            vals = [fn(list(row)) if len(row) else mpmath.mpf(0) for row in rows]
        out = np.empty(len(vals), dtype=object)
        out[:] = vals
        return out.reshape(a.shape[:-1] + (1,))


def _elementwise(fn, a):
    a = np.asarray(a, dtype=object)
    out = np.empty(a.shape, dtype=object)
    with mpmath.workprec(MP_PREC):
        out.reshape(-1)[:] = [fn(v) for v in a.reshape(-1)]
    return out


F64 = _Float64Exact()
MP = _MPExact()
BACKENDS = {"float64": F64, "mpmath": MP}
