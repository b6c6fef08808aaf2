"""The mpmath backend: numpy object arrays of ``mpmath.mpf`` at ``MP_PREC`` = 256 bits.

Every operation is mpmath's, correctly rounded to 256 bits (sums by
``mpmath.fsum``), so a result's own error is ~2**-250 relative: zero for every
purpose here.  Inputs are float64 values, exact in 256 bits.  Slow; for small
tensors and hostile inputs, and to evaluate exactly the elements the float64
backend's ``pointwise`` cannot trust.  The interface is the one in
``oracle.backends``.
"""
from __future__ import annotations

import mpmath
import numpy as np

from . import sums

MP_PREC = 256


class MPExact:
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

    def exp_times(self, t, *factors):
        out = self.exp(t)
        for f in factors:
            out = out * np.asarray(f, dtype=object)
        return out

    def exp(self, a):
        return _elementwise(mpmath.exp, a)

    # Past |v| = 2**500 (mpmath's erfc overflows there) these take their limits: the tails left out,
    # below e**(-2**998), change no float64 result, since every product the oracles form with them
    # has at most two more factors below 2**1024.
    def ncdf(self, a):
        return _elementwise(_limited(lambda v: mpmath.erfc(-v / mpmath.sqrt(2)) / 2, 1, 0), a)

    def npdf(self, a):
        return _elementwise(_limited(lambda v: mpmath.exp(-v * v / 2) / mpmath.sqrt(2 * mpmath.pi), 0, 0), a)

    def sigmoid_cubic(self, a, c1, c3):
        return _elementwise(_limited(lambda v: 1 / (1 + mpmath.exp(-(c1 * v + c3 * v ** 3))), 1, 0), a)

    def row_sum(self, a):
        return self._reduce(a, lambda row: mpmath.fsum(row))

    def row_dot(self, a, b):
        a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        return self._reduce(a * b, lambda row: mpmath.fsum(row))

    def scaled_sum(self, a, b):
        return a + b, 1

    def pointwise(self, fn, *arrays, risky=None, scaled=False, overflows=None, tails=()):
        return fn(self, *arrays)

    def row_peak(self, a):
        return sums.row_peak(self.to_float64(a))

    def mul_add_(self, a, m, b=None):
        a *= m
        if b is not None:
            a += b
        return a

    def center(self, a):
        m = self.row_sum(a) / a.shape[-1]
        return a - m, m

    def inv_rms(self, a, eps):
        ms = self.row_dot(a, a) / a.shape[-1]
        return 1 / _elementwise(mpmath.sqrt, ms + self.array(np.broadcast_to(eps, ms.shape)))

    @staticmethod
    def _reduce(a, fn):
        a = np.asarray(a, dtype=object)
        rows = a.reshape(-1, a.shape[-1]) if a.size else np.empty((int(np.prod(a.shape[:-1])), 0), object)
        with mpmath.workprec(MP_PREC):
            vals = [fn(list(row)) if len(row) else mpmath.mpf(0) for row in rows]
        out = np.empty(len(vals), dtype=object)
        out[:] = vals
        return out.reshape(a.shape[:-1] + (1,))


def _limited(fn, at_plus, at_minus):
    """fn, but at_plus / at_minus (its limits at +-inf) for |v| > 2**500; NaN stays NaN."""
    big = mpmath.mpf(2) ** 500
    return lambda v: fn(v) if not abs(v) > big else mpmath.mpf(at_plus if v > 0 else at_minus)


def _elementwise(fn, a):
    a = np.asarray(a, dtype=object)
    out = np.empty(a.shape, dtype=object)
    with mpmath.workprec(MP_PREC):
        out.reshape(-1)[:] = [fn(v) for v in a.reshape(-1)]
    return out


MP = MPExact()
