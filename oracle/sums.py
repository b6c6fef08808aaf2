"""Certified row sums: correctly rounded sum_i a_i (or sum_i a_i**2) of every row, fast when a certificate allows.

How a row sum is computed (Rump, Ogita & Oishi's error-free extraction,
``eft.extract``; ``u = 2**-53``, n terms per row):

1. ``sigma = 2**k`` per row, ``2**k >= (n + 2) max|a_i|``.  Then
   ``q_i = (sigma + a_i) - sigma`` are multiples of ``2**(k-53)`` with
   ``|sum q| < sigma``, so their float sum ``tau`` is exact in any order, and
   ``r_i = a_i - q_i`` is exact with ``|r_i| <= 2**(k-53)``.
2. ``t = fl(sum r_i)`` (any order) is off by at most
   ``gamma_{n-1} sum|r_i| <= E = 2**(2 ceil(log2 n) - 105 + k)``.
3. ``hi + lo = tau + t`` exactly (TwoSum).  The exact sum ``S`` lies in
   ``[hi + lo - E, hi + lo + E]``; if that interval is inside the rounding
   interval of ``hi`` (``2|lo| + 2E < gap``, ``gap`` the spacing of floats at
   ``hi``, halved at a power of two) then ``RN(S) = hi``, certified.
4. Rows the certificate does not cover (heavy cancellation, exact zeros, a
   tie, rows within ``2**-(G+1)`` of overflow) get one more extraction, of the
   remainders r_i at ``sigma' = 2**(k - 53 + G)`` (``G = bit_length(n + 1)``):
   ``tau + tau'`` is exact, and the error bound shrinks by about 2**(G - 52).
   Rows still not certified are summed exactly by ``exact.exact_sums``.  Either
   way the result is the exactly rounded sum.

Steps 1 and 2 run in ``native.c`` (one pass) where the native kernels are
loaded, else as torch ops (``eft.extract``); both satisfy the bounds above, so
the result is the same.  Rows holding a non-finite value are summed in plain
IEEE arithmetic.
"""
from __future__ import annotations

import numpy as np
import torch

from . import native
from .arrays import buf, np64, th
from .eft import U, extract, pow2, two_sum
from .exact import exact_sums


def extremes(a: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(max, min) of every row, keepdims, as ndarrays (NaN in a row gives NaN)."""
    lib = native.kernels()
    if lib is not None:
        return lib.minmax(a)
    return a.amax(-1, keepdim=True).numpy(), a.amin(-1, keepdim=True).numpy()


def absmax(a: torch.Tensor) -> np.ndarray:
    """max |a_i| of every row, keepdims (NaN if the row has one, inf if it has ±inf)."""
    hi, lo = extremes(a)
    return np.maximum(hi, -lo)


def row_peak(a) -> np.ndarray:
    """max_i |a_i| of every row of a float64 array, keepdims (0 for empty rows, NaN where a row has one)."""
    x = th(np64(a))
    if x.numel() == 0:
        return np.zeros(x.shape[:-1] + (1,))
    return absmax(x)


def _terms(a: torch.Tensor, square: bool) -> torch.Tensor:
    return torch.mul(a, a, out=buf(1, a)) if square else a


def sum_dd(a: torch.Tensor, k: np.ndarray, square: bool = False):
    """(hi, lo, err, tau, rem): |sum a - (hi + lo)| <= err after one extraction at 2**k.

    With ``square`` the terms are a_i**2 (each rounded once).  ``rem`` holds the
    remainders for ``sum_dd_again`` (None when the native kernels ran).
    """
    n = a.shape[-1]
    L = (n - 1).bit_length()
    lib = native.kernels()
    if lib is not None:
        tau, t = lib.extract(a, k, square)
        rem = None
    else:
        tau, t, rem = extract(_terms(a, square), k)
    hi, lo = two_sum(tau, t)
    return hi, lo, pow2(np.maximum(2 * L - 105 + k, -1074)), tau, rem


def sum_dd_again(a, rem, k, tau, rows, square=False):
    """(hi, lo, err) for the given rows, from a second extraction of the first one's remainders.

    ``k`` and ``tau`` are the first pass's; the remainders are bounded by
    2**(k-53), so the second sigma is 2**(k - 53 + G).
    """
    n = a.shape[-1]
    G, L = (n + 1).bit_length(), (n - 1).bit_length()
    idx = torch.from_numpy(rows)
    if rem is None:  # recompute the first pass's remainders for these rows only
        _, _, r = extract(_terms(a.reshape(-1, n)[idx], square), k.reshape(-1)[rows][:, None])
        r = r.clone()
    else:
        r = rem.reshape(-1, n)[idx]
    k2 = np.maximum(k.reshape(-1)[rows] - 53 + G, -1074 + G)[:, None]
    tau2, t2, _ = extract(r, k2)
    h, l = two_sum(tau.reshape(-1)[rows][:, None], tau2)  # exact
    l2 = l + t2  # off by at most u |l2|
    hi, lo = two_sum(h, l2)
    err = 2.0 * np.maximum(pow2(np.maximum(2 * L - 105 + k2, -1074)), U * np.abs(l2))
    return hi, lo, err


def rounds_to_hi(hi, lo, err):
    """True where RN(s) == hi for every real s with |s - (hi + lo)| <= err (hi != 0)."""
    m, j = np.frexp(hi)  # |hi| = |m| 2**j, |m| in [1/2, 1)
    j = j.astype(np.int64)
    ulp = pow2(np.maximum(j - 53, -1074))
    # below a power of two the spacing halves (unless that is already subnormal)
    gap = np.where((np.abs(m) == 0.5) & (j - 54 >= -1074), ulp * 0.5, ulp)
    # gap is a power of two, so fl(x) < gap implies x < gap (rounding is monotone)
    return (hi != 0) & np.isfinite(hi) & (2.0 * np.abs(lo) + 2.0 * err < gap)


def sum_bounded(a: torch.Tensor, e: np.ndarray, fin: np.ndarray, zero: np.ndarray,
                square: bool = False) -> np.ndarray:
    """Correctly rounded row sums of ``a`` (of ``a**2`` with ``square``), given every term <= 2**e.

    ``fin``: rows known to be finite (others are summed in plain IEEE);
    ``zero``: rows known to be all zeros.
    """
    n = a.shape[-1]
    k = e + (n + 1).bit_length()
    fast = fin & ~zero & (k <= 1022)
    k = np.where(fast, k, 0)
    with np.errstate(all="ignore"):
        hi, lo, err, tau, rem = sum_dd(a, k, square)
        ok = fast & rounds_to_hi(hi, lo, err)
        again = np.flatnonzero((fast & ~ok).reshape(-1))
        if again.size:  # cancellation or a near-tie: one more extraction on those rows
            h2, l2, e2 = sum_dd_again(a, rem, k, tau, again, square)
            hi.reshape(-1)[again] = h2[:, 0]
            ok.reshape(-1)[again] = rounds_to_hi(h2, l2, e2)[:, 0]
    del rem
    out = np.where(zero, 0.0, hi)
    _repair_sums(out, a, ok | zero, fin, square)
    return out


def _repair_sums(out, a, ok, fin, square=False):
    """Fill the rows of ``out`` not marked ``ok``: plain IEEE where not finite, else exact."""
    if ok.all():
        return
    n = a.shape[-1]
    flat = out.reshape(-1)
    a2 = a.reshape(-1, n)
    bad = ~ok.reshape(-1)
    for rows, exact in ((np.flatnonzero(bad & ~fin.reshape(-1)), False), (np.flatnonzero(bad & fin.reshape(-1)), True)):
        if rows.size:
            r = a2[torch.from_numpy(rows)].numpy()
            with np.errstate(all="ignore"):
                r = r * r if square else r
                flat[rows] = exact_sums(r) if exact else r.sum(axis=1)
