"""The two evaluation paths every oracle runs on.

Each op in ``oracle/`` is written once, against the small interface below, and
evaluated by either backend:

``MP``        numpy object arrays of ``mpmath.mpf`` at 256 bits.  Its own error
              is ~2**-250 relative: zero for every purpose here.  Slow; for
              small tensors and hostile inputs (``mpmath_backend``).
``F64``       numpy float64 arrays whose reductions are *correctly rounded*:
              each row sum and row dot product is the exact sum of its terms
              rounded once to nearest-even, on every finite row, always.  Its
              own error is a few float64 ulps of each result's natural scale,
              which the error model adds to every bound (``float64_backend``).

Where the float64 backend's pieces live: ``eft`` (error-free
transformations: TwoSum, Veltkamp's split, TwoProduct, extraction), ``sums``
(certified, correctly rounded row sums), ``exact`` (the exact slow paths, with
Python integers), ``native`` and ``native.c`` (optional one-pass C kernels for
the extraction; ``NORMCERT_ORACLE_NATIVE=0`` turns them off), ``special``
(GELU's special functions, their arguments in double-double), ``arrays``
(numpy/torch views and scratch buffers).

Interface (``a`` has rows along the last axis; results keep that axis as 1):

    B.array(a)            float64 ndarray -> backend array
    B.to_float64(a)       backend array -> float64 ndarray (rounded to nearest)
    B.row_sum(a)          sum_i a_i
    B.row_dot(a, b)       sum_i a_i b_i
    B.center(a)           (d, m): m = mean(a) and d = a - m, with d accurate to
                          a few ulps *of d* (not of m) even when |m| >> std(a)
    B.inv_rms(a, eps)     1 / sqrt(mean(a**2) + eps), never overflowing (eps: a
                          float, or one per row)
    B.scaled_sum(a, b)    (s, c) with s = c (a + b) exactly, c = 1 unless a + b
                          overflows float64 (then c = 1/2 for that row)
    B.row_peak(a)         max_i |a_i| of every row, as a float64 ndarray (NaN
                          where the row has a NaN)
    B.exp                 elementwise
    B.exp_times(t, *f)    e**t times the factors f, elementwise, with nothing under- or overflowing
                          before the result (F64 scales e**t by a power of two: ``exp_times``)
    B.ncdf(a), B.npdf(a)  the standard normal CDF Phi(a) = erfc(-a / sqrt 2) / 2 and density
                          phi(a) = e**(-a**2 / 2) / sqrt(2 pi), elementwise
    B.sigmoid_cubic(a, c1, c3)
                          sigma(c1 a + c3 a**3) = 1 / (1 + e**-(c1 a + c3 a**3)), elementwise,
                          for real constants c1, c3 given as mpmath numbers; F64 forms the
                          arguments of all three in double-double (``special``)
    B.mul_add_(a, m, b)   a = a * m (+ b), in place on ``a`` (an array the caller
                          owns), m and b broadcast; returns a
    B.pointwise(fn, *a, risky=None, scaled=False, overflows=None, tails=())
                          fn(B, *a) for an elementwise formula fn.  MP evaluates
                          it as is.  F64 evaluates it in float64 and then
                          re-evaluates, exactly (with MP), every element where
                          float64 cannot be trusted: a non-finite input or
                          result, a result within 2**-1000 of 0 or beyond
                          2**1000 (an intermediate may have flushed or
                          overflowed; not where ``scaled``: fn forms its result
                          with no intermediate under- or overflow, e.g. by
                          ``exp_times``), or where ``risky`` (a function of the
                          float64 inputs) says so; but not where ``overflows``
                          (a function of the float64 result and inputs) proves
                          the result's ±inf the exact value's rounding.  Each
                          of ``tails``, (where, value): where where(*a) holds
                          (a band of finite inputs whose formula under- or
                          overflows in float64, e.g. e**g for g < -600), F64
                          takes value(B, *a) instead of fn, a float64 form of
                          the same exact value built with ``exp_times`` (no
                          intermediate under- or overflow) and good to
                          ORACLE, as its caller derives; MP ignores them.

NaN and ±Inf: rows holding a non-finite value are reduced in plain IEEE
arithmetic (``inf + -inf = nan``), which is what the exact value of the maths
is under IEEE conventions.
"""
from __future__ import annotations

from .float64_backend import F64
from .mpmath_backend import MP, MP_PREC

__all__ = ["BACKENDS", "F64", "MP", "MP_PREC"]

BACKENDS = {"float64": F64, "mpmath": MP}
