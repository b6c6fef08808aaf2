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

    def exp(self, a):
        return _elementwise(mpmath.exp, a)

    def row_sum(self, a):
        return self._reduce(a, lambda row: mpmath.fsum(row))

    def row_dot(self, a, b):
        a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        return self._reduce(a * b, lambda row: mpmath.fsum(row))

    def scaled_sum(self, a, b):
        return a + b, 1

    def pointwise(self, fn, *arrays, risky=None):
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


def _elementwise(fn, a):
    a = np.asarray(a, dtype=object)
    out = np.empty(a.shape, dtype=object)
    with mpmath.workprec(MP_PREC):
        out.reshape(-1)[:] = [fn(v) for v in a.reshape(-1)]
    return out


MP = MPExact()
