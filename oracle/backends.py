"""The two evaluation paths every oracle runs on.

Each op in ``oracle/`` is written once, against the small interface below, and
evaluated by either backend:

``MP``        numpy object arrays of ``mpmath.mpf`` at 256 bits.  Its own error
              is ~2**-250 relative: zero for every purpose here.  Slow; for
              small tensors and hostile inputs.
``F64``       numpy float64 arrays (the reductions run as torch float64 ops on
              the same memory) whose reductions are *correctly rounded*: each
              row sum and row dot product is the exact sum of its terms rounded
              once to nearest-even, on every finite row, always -- a cheap
              certificate decides when the fast path has the answer and
              otherwise an exact slow path computes it.  No one-pass variance,
              no unscaled sum of squares.  Its own error is a few float64 ulps
              of each result's natural scale, which the error model adds to
              every bound.

How a row sum is computed (Rump, Ogita & Oishi's error-free extraction):

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
   tie, rows within ``2**-(G+1)`` of overflow) are summed exactly by the slow
   path: repeated extraction until the remainder is zero, then ``math.fsum``
   of the (exact) partial sums; rows too close to overflow for that, with
   Python integers.  Either way the result is the exactly rounded sum.

A dot product ``sum a_i b_i`` first scales rows by powers of two only where
products could over- or underflow (every |a|, |b| row maximum outside
``2**±400``), splits each product exactly, ``a_i b_i = p_i + e_i`` (Dekker's
TwoProduct), extracts the ``p_i`` as above and adds ``fl(sum e_i)`` to the
remainder; the certificate's ``E`` also covers the bits lost to underflow in
TwoProduct or in the scaling.  Uncertified rows are computed exactly with
Python integers.  So ``row_dot`` is correctly rounded too.

``center`` gets ``S = sum a_i`` as the double-double ``hi + lo`` above (within
``E``), the mean as ``mh + ml`` (``mh = fl(hi/n)``, ``ml`` from the exact
residual ``hi - n mh``), and ``d_i = fl(fl(a_i - mh) - ml)`` (the ``- ml`` is
skipped when it cannot matter).  The certificate: the mean's error bound
plus any skipped ``ml`` is at most ``0.45 u`` times the row's spread
``max a - min a``; since ``max |d| >= spread / 2`` every ``d_i`` is then within
``4 u max|d|`` (plus ``2**-1072`` absolute).  Constant rows give ``d = 0``
exactly; uncertified rows take the slow path (mean of the exactly rounded sum,
then the exactly rounded mean of the residuals as a correction), accurate to a
few ``u max|d|`` as well.

``inv_rms`` squares the row (pre-scaled by a power of two only where a square
could over- or underflow) and takes the correctly rounded sum of the squares:
``mean(a**2)`` is within ``3u`` of exact (each square rounded once, the sum
rounded once, the division by ``n``), and ``1 / sqrt(ms + eps)`` adds two
more roundings.

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
    B.mul_add_(a, m, b)   a = a * m (+ b), in place on ``a`` (an array the caller
                          owns), m and b broadcast; returns a
    B.pointwise(fn, *a, risky=None)
                          fn(B, *a) for an elementwise formula fn.  MP evaluates
                          it as is.  F64 evaluates it in float64 and then
                          re-evaluates, exactly (with MP), every element where
                          float64 cannot be trusted: a non-finite input or
                          result, a result within 2**-1000 of 0 or beyond
                          2**1000 (an intermediate may have flushed or
                          overflowed), or where ``risky`` (a function of the
                          float64 inputs) says so.

NaN and ±Inf: rows holding a non-finite value are reduced in plain IEEE
arithmetic (``inf + -inf = nan``), which is what the exact value of the maths
is under IEEE conventions.
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import mpmath
import numpy as np
import torch

MP_PREC = 256

_U = 2.0 ** -53
_SPLIT = 134217729.0  # 2**27 + 1, Veltkamp's splitter for binary64
_SAFE_EXP = 400  # rows whose max |.| lies in [2**-400, 2**400) are never scaled
_SCRATCH_MAX = 1 << 22  # elements per reusable scratch buffer (32 MiB); larger ones are fresh
_scratch = threading.local()


# ---------------------------------------------------------------------------
# conversions


def _np(a) -> np.ndarray:
    """A float64 ndarray (no copy when it already is one)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def _th(a: np.ndarray) -> torch.Tensor:
    """A torch view of a float64 ndarray (a copy only when torch cannot view it)."""
    if not a.flags.writeable or any(s < 0 for s in a.strides) or not a.dtype.isnative:
        a = np.array(a, dtype=np.float64)
    return torch.from_numpy(a)


def _buf(slot: int, like: torch.Tensor) -> torch.Tensor:
    """A float64 scratch tensor shaped like ``like``, reused across calls (contents undefined).

    Fresh 2-D+ float64 buffers cost a page fault per 4 KiB every time, as much
    as a pass over the data; the reductions reuse a few per thread instead.
    Nothing returned to a caller ever aliases one.
    """
    n = like.numel()
    if n > _SCRATCH_MAX:
        return torch.empty(like.shape, dtype=torch.float64)
    cache = getattr(_scratch, "bufs", None)
    if cache is None:
        cache = _scratch.bufs = {}
    t = cache.get(slot)
    if t is None or t.numel() < n:
        t = cache[slot] = torch.empty(n, dtype=torch.float64)
    t = t[:n]
    if like.dim() == 2 and not like.is_contiguous() and like.t().is_contiguous():
        return t.view(like.shape[1], like.shape[0]).t()  # same layout as a transposed input
    return t.view(like.shape)


def _rows(a: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(max, min) of every row, keepdims, as ndarrays (NaN in a row gives NaN)."""
    lib = _clib()
    if lib is not None:
        return lib.minmax(a)
    return a.amax(-1, keepdim=True).numpy(), a.amin(-1, keepdim=True).numpy()


def _absmax(a: torch.Tensor) -> np.ndarray:
    """max |a_i| of every row, keepdims (NaN if the row has one, inf if it has ±inf)."""
    hi, lo = _rows(a)
    return np.maximum(hi, -lo)


def _pow2(k) -> np.ndarray:
    """2**k for integer arrays k in [-1074, 1023]."""
    return np.ldexp(1.0, np.asarray(k, dtype=np.int64))


def _scale(a: torch.Tensor, k: np.ndarray) -> torch.Tensor:
    """a * 2**-k per row, in two steps so each factor is representable."""
    k1 = -(k // 2)
    k2 = -k - k1
    out = torch.mul(a, torch.from_numpy(_pow2(k1)))
    return out.mul_(torch.from_numpy(_pow2(k2)))


def _exps(m: np.ndarray) -> np.ndarray:
    """e with m < 2**e for finite m >= 0 (0 for m == 0 and non-finite m)."""
    _, e = np.frexp(np.where(np.isfinite(m), m, 0.0))
    return e.astype(np.int64)


def _two_sum(a, b):
    s = a + b
    z = s - a
    return s, (a - (s - z)) + (b - z)


def _split_np(a):
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def _two_prod_np(a, b):
    """p + e == a * b exactly (Dekker), barring over/underflow."""
    p = a * b
    ah, al = _split_np(a)
    bh, bl = _split_np(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


# ---------------------------------------------------------------------------
# the certified fast path


def _extract(a: torch.Tensor, k: np.ndarray):
    """One extraction at sigma = 2**k per row, with torch ops.

    Returns (tau, t, rem): tau the exact sum of the parts of ``a`` on the grid
    2**(k-53), rem the (exact) remainders (in scratch slot 0), t = fl(sum rem).
    """
    sig = torch.from_numpy(_pow2(k))
    q = torch.add(a, sig, out=_buf(0, a))
    q.sub_(sig)
    tau = q.sum(-1, keepdim=True)
    torch.sub(a, q, out=q)
    return tau.numpy(), q.sum(-1, keepdim=True).numpy(), q


def _terms(a: torch.Tensor, square: bool) -> torch.Tensor:
    return torch.mul(a, a, out=_buf(1, a)) if square else a


def _sum_dd(a: torch.Tensor, k: np.ndarray, square: bool = False):
    """(hi, lo, err, tau, rem): |sum a - (hi + lo)| <= err after one extraction at 2**k.

    With ``square`` the terms are a_i**2 (each rounded once).  ``rem`` holds the
    remainders for ``_sum_dd_again`` (None when the compiled helper ran).
    """
    n = a.shape[-1]
    L = (n - 1).bit_length()
    lib = _clib()
    if lib is not None:
        tau, t = lib.extract(a, k, square)
        rem = None
    else:
        tau, t, rem = _extract(_terms(a, square), k)
    hi, lo = _two_sum(tau, t)
    return hi, lo, _pow2(np.maximum(2 * L - 105 + k, -1074)), tau, rem


def _sum_dd_again(a, rem, k, tau, rows, square=False):
    """(hi, lo, err) for the given rows, from a second extraction of the first one's remainders.

    ``k`` and ``tau`` are the first pass's; the remainders are bounded by
    2**(k-53), so the second sigma is 2**(k - 53 + G).
    """
    n = a.shape[-1]
    G, L = (n + 1).bit_length(), (n - 1).bit_length()
    idx = torch.from_numpy(rows)
    if rem is None:  # recompute the first pass's remainders for these rows only
        _, _, r = _extract(_terms(a.reshape(-1, n)[idx], square), k.reshape(-1)[rows][:, None])
        r = r.clone()
    else:
        r = rem.reshape(-1, n)[idx]
    k2 = np.maximum(k.reshape(-1)[rows] - 53 + G, -1074 + G)[:, None]
    tau2, t2, _ = _extract(r, k2)
    h, l = _two_sum(tau.reshape(-1)[rows][:, None], tau2)  # exact
    l2 = l + t2  # off by at most u |l2|
    hi, lo = _two_sum(h, l2)
    err = 2.0 * np.maximum(_pow2(np.maximum(2 * L - 105 + k2, -1074)), _U * np.abs(l2))
    return hi, lo, err


def _rounds_to_hi(hi, lo, err):
    """True where RN(s) == hi for every real s with |s - (hi + lo)| <= err (hi != 0)."""
    m, j = np.frexp(hi)  # |hi| = |m| 2**j, |m| in [1/2, 1)
    j = j.astype(np.int64)
    ulp = _pow2(np.maximum(j - 53, -1074))
    # below a power of two the spacing halves (unless that is already subnormal)
    gap = np.where((np.abs(m) == 0.5) & (j - 54 >= -1074), ulp * 0.5, ulp)
    # gap is a power of two, so fl(x) < gap implies x < gap (rounding is monotone)
    return (hi != 0) & np.isfinite(hi) & (2.0 * np.abs(lo) + 2.0 * err < gap)


def _sum_bounded(a: torch.Tensor, e: np.ndarray, fin: np.ndarray, zero: np.ndarray,
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
        hi, lo, err, tau, rem = _sum_dd(a, k, square)
        ok = fast & _rounds_to_hi(hi, lo, err)
        again = np.flatnonzero((fast & ~ok).reshape(-1))
        if again.size:  # cancellation or a near-tie: one more extraction on those rows
            h2, l2, e2 = _sum_dd_again(a, rem, k, tau, again, square)
            hi.reshape(-1)[again] = h2[:, 0]
            ok.reshape(-1)[again] = _rounds_to_hi(h2, l2, e2)[:, 0]
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
                flat[rows] = _exact_sums(r) if exact else r.sum(axis=1)


# ---------------------------------------------------------------------------
# the exact slow paths


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


def _py_sum(vals) -> float:
    tot = 0
    for v in vals:
        m, x = _int_of(v)
        tot += m << x
    return _int_to_float(tot, 1126)


def _py_dot(xs, ys) -> float:
    tot = 0
    for x, y in zip(xs, ys):
        mx, ex = _int_of(x)
        my, ey = _int_of(y)
        tot += (mx * my) << (ex + ey)
    return _int_to_float(tot, 2252)


def _py_center(vals) -> tuple[list[float], float]:
    """(RN(a_i - m) for each i, RN(m)), m the exact mean, with Python integers."""
    ints = [_int_of(v) for v in vals]
    n = len(ints)
    tot = sum(m << x for m, x in ints)
    d = [_int_to_float(n * (m << x) - tot, 1126, n) for m, x in ints]
    return d, _int_to_float(tot, 1126, n)


def _exact_sums(a: np.ndarray) -> np.ndarray:
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
        big = ~nonfin & (_exps(m) + grid > 1022)
        for i in np.flatnonzero(big):
            out[i] = _py_sum(a[i].tolist())
        rest = ~(nonfin | big)
        r = a[rest].copy()
        taus = []
        # each pass leaves |r| <= 2**(grid - 52) max|r|: from 2**1022 to 0 in a bounded number
        for _ in range(2 + 2100 // (52 - grid)):
            m = np.max(np.abs(r), axis=1, keepdims=True) if r.size else r
            if not m.any():
                break
            sigma = _pow2(_exps(m) + grid)
            q = (sigma + r) - sigma  # on the grid 2**(k-53): their float sum is exact
            r -= q  # exact
            taus.append(q.sum(axis=1))
        else:
            raise AssertionError("exact summation did not terminate")
    if taus:
        out[rest] = [math.fsum(col) for col in zip(*(t.tolist() for t in taus))]
    return out


# ---------------------------------------------------------------------------


class _Float64Exact:
    name = "float64"

    def array(self, a):
        return np.asarray(a, dtype=np.float64)

    def to_float64(self, a):
        return _np(a)

    exp = staticmethod(np.exp)

    def mul_add_(self, a, m, b=None):
        t = torch.from_numpy(a)  # torch: multi-threaded, and b + a*m in one pass
        m = torch.from_numpy(np.asarray(m, dtype=np.float64))
        if b is None:
            t.mul_(m)
        else:
            torch.addcmul(torch.from_numpy(np.asarray(b, dtype=np.float64)), t, m, out=t)
        return a

    def row_peak(self, a):
        x = _th(_np(a))
        if x.numel() == 0:
            return np.zeros(x.shape[:-1] + (1,))
        return _absmax(x)

    def pointwise(self, fn, *arrays, risky=None):
        arrays = np.broadcast_arrays(*[_np(a) for a in arrays])
        with np.errstate(all="ignore"):
            out = np.array(fn(self, *arrays), dtype=np.float64)
            mag = np.abs(out)
            redo = ~np.isfinite(out) | (mag > 2.0 ** 1000) | ((mag < 2.0 ** -1000) & (out != 0))
            for a in arrays:
                redo |= ~np.isfinite(a)
            if risky is not None:
                redo |= risky(*arrays)
        if redo.any():
            with mpmath.workprec(MP_PREC):
                exact = fn(MP, *[MP.array(a[redo]) for a in arrays])
                out[redo] = MP.to_float64(exact)
        return out

    # ---- exact reductions -------------------------------------------------
    def row_sum(self, a):
        x = _th(_np(a))
        n = x.shape[-1]
        if n == 0 or x.numel() == 0:
            return np.zeros(x.shape[:-1] + (1,))
        m = _absmax(x)
        fin = np.isfinite(m)
        return _sum_bounded(x, _exps(m), fin, fin & (m == 0))

    def row_dot(self, a, b):
        a0, b0 = torch.broadcast_tensors(_th(_np(a)), _th(_np(b)))
        n = a0.shape[-1]
        lead = a0.shape[:-1]
        if n == 0 or a0.numel() == 0:
            return np.zeros(lead + (1,))
        ma, mb = _absmax(a0), _absmax(b0)
        fin = np.isfinite(ma) & np.isfinite(mb)
        zero = fin & ((ma == 0) | (mb == 0))
        ea, eb = _exps(ma), _exps(mb)
        scale = fin & ~zero & ((np.abs(ea) > _SAFE_EXP) | (np.abs(eb) > _SAFE_EXP))
        a1, b1 = a0, b0
        if scale.any():
            ka, kb = np.where(scale, ea, 0), np.where(scale, eb, 0)
            a1, b1 = _scale(a0, ka), _scale(b0, kb)
            ea, eb = ea - ka, eb - kb
        else:
            ka = kb = np.zeros_like(ea)
        G, L = (n + 1).bit_length(), (n - 1).bit_length()
        k = np.where(fin & ~zero, ea + eb + G, 0)
        with np.errstate(all="ignore"):
            lib = _clib()
            if lib is not None:
                tau, tr, te = lib.dot(a1, b1, k)
            else:
                p = torch.mul(a1, b1, out=_buf(1, a1))
                ah, al = _split_th(a1, 2)
                bh, bl = _split_th(b1, 4)
                e = torch.mul(ah, bh, out=_buf(6, a1))
                e.sub_(p)
                e.add_(ah.mul_(bl))  # ah is free after this: it holds the cross products from here
                e.add_(torch.mul(al, bh, out=ah))
                e.add_(torch.mul(al, bl, out=ah))
                del ah, al, bh, bl
                tau, tr, _ = _extract(p, k)
                te = e.sum(-1, keepdim=True).numpy()
            hi, lo = _two_sum(tau, tr + te)
            err = _pow2(np.maximum(2 * L - 104 + k, L - 1070) + 1)
            ok = fin & ~zero & _rounds_to_hi(hi, lo, err)
            out = np.where(zero, 0.0, hi)
            if scale.any():
                out = np.ldexp(out, ka + kb)
                # unscaling a result into the subnormal range would round twice
                ok &= ~(scale & (np.abs(out) < 2.0 ** -1022))
        done = ok | zero
        if not done.all():
            flat = out.reshape(-1)
            a2, b2 = a0.reshape(-1, n), b0.reshape(-1, n)
            for i in np.flatnonzero(~done.reshape(-1)):
                if fin.reshape(-1)[i]:
                    flat[i] = _py_dot(a2[i].tolist(), b2[i].tolist())
                else:
                    flat[i] = float((a2[i] * b2[i]).sum())
        return out

    def scaled_sum(self, a, b):
        a, b = _np(a), _np(b)
        with np.errstate(all="ignore"):
            s = np.add(a, b)
            if s.size == 0:
                return s, np.ones(s.shape[:-1] + (1,))
            t = _th(s)
            if bool(torch.isfinite(t.amax()) & torch.isfinite(t.amin())):
                return s, np.ones(s.shape[:-1] + (1,))
            over = (np.isinf(s) & np.isfinite(a) & np.isfinite(b)).any(axis=-1, keepdims=True)
            c = np.where(over, 0.5, 1.0)
            return np.where(over, a * 0.5 + b * 0.5, s), c

    def center(self, a):
        a = _np(a)
        x = _th(a)
        n = x.shape[-1]
        lead = x.shape[:-1]
        if n == 0 or x.numel() == 0:
            return a.copy(), np.full(lead + (1,), np.nan)
        amax, amin = _rows(x)
        with np.errstate(all="ignore"):
            m = np.maximum(amax, -amin)
            fin = np.isfinite(m)
            const = fin & (amax == amin)  # includes all-zero rows: d = 0 exactly
            k = _exps(m) + (n + 1).bit_length()
            fast = fin & ~const & (k <= 1022)
            k = np.where(fast, k, 0)
            room = 0.45 * _U * (amax - amin)  # max|d| >= spread / 2
            hi, lo, err, tau, rem = _sum_dd(x, k)
            mh, ml, m_err = _mean_dd(hi, lo, err, n)
            ok = fast & (m_err <= room)
            again = np.flatnonzero((fast & ~ok).reshape(-1))
            if again.size:  # |mean| >> spread: one more extraction on those rows
                h2, l2, e2 = _sum_dd_again(x, rem, k, tau, again)
                mh2, ml2, me2 = _mean_dd(h2, l2, e2, n)
                for full, part in ((mh, mh2), (ml, ml2), (m_err, me2)):
                    full.reshape(-1)[again] = part[:, 0]
                ok.reshape(-1)[again] = (me2 <= room.reshape(-1)[again][:, None])[:, 0]
            del rem
            mh, ml = np.where(fast, mh, amax), np.where(fast, ml, 0.0)
            skip_ml = bool(np.all(~ok | (m_err + np.abs(ml) <= room)))
            dt = torch.empty(a.shape, dtype=torch.float64)
            d = dt.numpy()
            torch.sub(x, torch.from_numpy(mh), out=dt)
            if not skip_ml:
                dt.sub_(torch.from_numpy(ml))
            mean = mh.copy()
            if const.any() or not ok.all():
                self._center_slow(x, d, mean, ok, const, fin)
        return d, mean

    def _center_slow(self, x, d, mean, ok, const, fin):
        n = x.shape[-1]
        x2, d2, m2 = x.reshape(-1, n), d.reshape(-1, n), mean.reshape(-1)
        c = np.flatnonzero(const.reshape(-1))
        d2[c] = 0.0
        m2[c] = x2[torch.from_numpy(c)][:, 0].numpy()
        slow = ~(ok | const).reshape(-1)
        with np.errstate(all="ignore"):
            nonfin = np.flatnonzero(slow & ~fin.reshape(-1))
            if nonfin.size:  # IEEE: the same two-pass formula, plain sums
                r = x2[torch.from_numpy(nonfin)].numpy()
                m1 = r.sum(axis=1, keepdims=True) / n
                dd = r - m1
                cc = dd.sum(axis=1, keepdims=True) / n
                d2[nonfin], m2[nonfin] = dd - cc, (m1 + cc)[:, 0]
            rows = np.flatnonzero(slow & fin.reshape(-1))
            if rows.size:
                r = x2[torch.from_numpy(rows)].numpy()
                m1 = (_exact_sums(r) / n)[:, None]
                dd = r - m1  # exact where a_i is within a factor 2 of m1 (Sterbenz)
                cc = (_exact_sums(dd) / n)[:, None]  # what rounding m1 and dd left behind
                d2[rows], m2[rows] = dd - cc, (m1 + cc)[:, 0]
                for i in np.flatnonzero(~np.isfinite(dd).all(axis=1)):  # a_i - m overflowed
                    d2[rows[i]], m2[rows[i]] = _py_center(r[i].tolist())

    def inv_rms(self, a, eps):
        x = _th(_np(a))
        n = x.shape[-1]
        lead = x.shape[:-1]
        eps = _np(eps)
        if n == 0 or x.numel() == 0:
            return np.full(lead + (1,), np.nan)
        with np.errstate(all="ignore"):
            m = _absmax(x)
            fin = np.isfinite(m)
            e = _exps(m)
            scale = fin & (np.abs(e) > _SAFE_EXP)
            k = np.where(scale, e, 0)  # x 2**-k has max |.| in [1/2, 1) where scaled
            if scale.any():
                x = _scale(x, k)
            # squares are >= 0, so rounding each one costs at most u relative: no
            # cancellation can amplify it, and their sum is correctly rounded
            ms = _sum_bounded(x, 2 * (e - k), fin, fin & (m == 0), square=True) / n
            # mean(a^2) + eps = (ms + eps 2**-2k) 2**2k
            r = np.ldexp(1.0 / np.sqrt(ms + np.ldexp(eps, -2 * k)), -k)
            direct = 1.0 / np.sqrt(np.ldexp(ms, 2 * k) + eps)  # where eps 2**-2k overflowed: eps dominates
            return np.where(np.isfinite(r) & (r > 0), r, direct)


def _mean_dd(hi, lo, err, n):
    """(mh, ml, bound): |(hi + lo) / n - (mh + ml)| + err / n <= bound."""
    s = np.where(np.abs(hi) > 2.0 ** 960, 2.0 ** -128, 1.0)  # keeps the split finite
    hs, ls = hi * s, lo * s
    mhs = hs / n
    p, pe = _two_prod_np(mhs, float(n))  # hs - p is exact (Sterbenz)
    mls = (((hs - p) - pe) + ls) / n
    mh, ml = mhs / s, mls / s
    return mh, ml, 2.0 * err / n + 10.0 * _U * _U * np.abs(mh) + 2.0 ** -1072


def _split_th(a: torch.Tensor, slot: int):
    """Veltkamp's split a = hi + lo, each with at most 26 significant bits (|a| < 2**996)."""
    hi = torch.mul(a, _SPLIT, out=_buf(slot, a))
    t = torch.sub(hi, a, out=_buf(slot + 1, a))
    hi.sub_(t)
    torch.sub(a, hi, out=t)
    return hi, t


# ---------------------------------------------------------------------------
# optional compiled helper: the same extraction and TwoProduct, one pass each


_C_SRC = r"""
/* normcert: one-pass error-free extraction kernels for oracle/backends.py.
   Built with -ffp-contract=off and without -ffast-math: every + - * below is
   one IEEE binary64 operation, rounded to nearest, in the order written. */
#include <string.h>

typedef long long i64;
typedef double v4 __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v4 ld4(const double *p) { v4 v; memcpy(&v, p, sizeof v); return v; }
static inline __attribute__((always_inline)) double hsum(v4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

/* Row r of x is x[r*rs + j*cs], j < n.  For every row, with s = sigma[r]:
   q_j = (s + v_j) - s, tau[r] = sum q_j (exact: the q_j lie on one grid),
   t[r] = fl(sum (v_j - q_j)); v_j = x_j, or x_j * x_j when SQ. */
#define EXTRACT(NAME, SQ)                                                         \
void NAME(const double *x, i64 rows, i64 n, i64 rs, i64 cs, const double *sigma,  \
          double *tau, double *t)                                                 \
{                                                                                 \
    if (cs != 1 && rs == 1) { /* rows are adjacent in memory: sweep columns */    \
        for (i64 r = 0; r < rows; r++) tau[r] = t[r] = 0.0;                       \
        for (i64 j = 0; j < n; j++) {                                             \
            const double *p = x + j * cs;                                         \
            for (i64 r = 0; r < rows; r++) {                                      \
                double v = p[r]; if (SQ) v = v * v;                               \
                double s = sigma[r];                                              \
                double q = (s + v) - s;                                           \
                tau[r] += q; t[r] += v - q;                                       \
            }                                                                     \
        }                                                                         \
        return;                                                                   \
    }                                                                             \
    for (i64 r = 0; r < rows; r++) {                                              \
        const double *p = x + r * rs;                                             \
        double s = sigma[r];                                                      \
        v4 S = {s, s, s, s}, Q0 = {0}, Q1 = {0}, R0 = {0}, R1 = {0};              \
        i64 j = 0;                                                                \
        if (cs == 1) {                                                            \
            for (; j + 8 <= n; j += 8) {                                          \
                v4 a = ld4(p + j), b = ld4(p + j + 4);                            \
                if (SQ) { a = a * a; b = b * b; }                                 \
                v4 qa = (S + a) - S, qb = (S + b) - S;                            \
                Q0 += qa; R0 += a - qa; Q1 += qb; R1 += b - qb;                   \
            }                                                                     \
        }                                                                         \
        double q = hsum(Q0) + hsum(Q1), rr = hsum(R0) + hsum(R1);                 \
        for (; j < n; j++) {                                                      \
            double v = p[j * cs]; if (SQ) v = v * v;                              \
            double a = (s + v) - s;                                               \
            q += a; rr += v - a;                                                  \
        }                                                                         \
        tau[r] = q; t[r] = rr;                                                    \
    }                                                                             \
}

EXTRACT(nc_extract, 0)
EXTRACT(nc_extract_sq, 1)

/* Row maxima and minima (NaN if the row holds one). */
typedef long long v4i __attribute__((vector_size(32)));
void nc_minmax(const double *x, i64 rows, i64 n, i64 rs, i64 cs, double *mx, double *mn)
{
    const double nan = __builtin_nan("");
    for (i64 r = 0; r < rows; r++) {
        const double *p = x + r * rs;
        double hi = -__builtin_inf(), lo = __builtin_inf();
        int bad = 0;
        i64 j = 0;
        if (cs == 1 && n >= 4) {
            v4 H = ld4(p), L = H;
            v4i N = (H != H);
            for (j = 4; j + 4 <= n; j += 4) {
                v4 v = ld4(p + j);
                v4i g = (v > H), l = (v < L);
                H = (v4)(((v4i)v & g) | ((v4i)H & ~g));
                L = (v4)(((v4i)v & l) | ((v4i)L & ~l));
                N |= (v != v);
            }
            for (int u = 0; u < 4; u++) {
                hi = H[u] > hi ? H[u] : hi;
                lo = L[u] < lo ? L[u] : lo;
                bad |= (N[u] != 0);
            }
        }
        for (; j < n; j++) {
            double v = p[j * cs];
            hi = v > hi ? v : hi;
            lo = v < lo ? v : lo;
            bad |= (v != v);
        }
        mx[r] = bad ? nan : hi;
        mn[r] = bad ? nan : lo;
    }
}

/* Dot products: p = fl(a b), e = a b - p exactly (Dekker's TwoProduct with
   Veltkamp's split), then the p are extracted at sigma as above:
   tau = sum q exactly, tr = fl(sum (p - q)), te = fl(sum e). */
#define SPLITTER 134217729.0
#define TWOPROD(A, B, P, E, T)                                                   \
    do {                                                                         \
        T ca = SPLITTER * (A), cb = SPLITTER * (B);                              \
        T ah = ca - (ca - (A)), bh = cb - (cb - (B));                            \
        T al = (A) - ah, bl = (B) - bh;                                          \
        P = (A) * (B);                                                           \
        E = (((ah * bh - P) + ah * bl) + al * bh) + al * bl;                     \
    } while (0)

void nc_dot(const double *a, i64 ars, i64 acs, const double *b, i64 brs, i64 bcs,
            i64 rows, i64 n, const double *sigma, double *tau, double *tr, double *te)
{
    if (acs != 1 && bcs != 1 && ars == 1 && brs == 1) {
        for (i64 r = 0; r < rows; r++) tau[r] = tr[r] = te[r] = 0.0;
        for (i64 j = 0; j < n; j++) {
            const double *pa = a + j * acs, *pb = b + j * bcs;
            for (i64 r = 0; r < rows; r++) {
                double x = pa[r], y = pb[r], p, e, s = sigma[r];
                TWOPROD(x, y, p, e, double);
                double q = (s + p) - s;
                tau[r] += q; tr[r] += p - q; te[r] += e;
            }
        }
        return;
    }
    for (i64 r = 0; r < rows; r++) {
        const double *pa = a + r * ars, *pb = b + r * brs;
        double s = sigma[r];
        v4 S = {s, s, s, s}, Q = {0}, R = {0}, E4 = {0};
        i64 j = 0;
        if (acs == 1 && bcs == 1) {
            for (; j + 4 <= n; j += 4) {
                v4 x = ld4(pa + j), y = ld4(pb + j), p, e;
                TWOPROD(x, y, p, e, v4);
                v4 q = (S + p) - S;
                Q += q; R += p - q; E4 += e;
            }
        }
        double q = hsum(Q), rr = hsum(R), ee = hsum(E4);
        for (; j < n; j++) {
            double x = pa[j * acs], y = pb[j * bcs], p, e;
            TWOPROD(x, y, p, e, double);
            double qq = (s + p) - s;
            q += qq; rr += p - qq; ee += e;
        }
        tau[r] = q; tr[r] = rr; te[r] = ee;
    }
}
"""
_CFLAGS = ("-O2", "-std=c99", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off", "-Wno-psabi")
_NATIVE = ("-march=native",)  # only where the cache key can name the cpu (its /proc/cpuinfo flags)
_clib_state: list = []  # [] not tried yet; [None] unavailable; [_CLib] loaded


class _CLib:
    """ctypes front end of the kernels in ``_C_SRC`` (rows along the last axis)."""

    def __init__(self, path):
        lib = ctypes.CDLL(str(path))
        p, i = ctypes.c_void_p, ctypes.c_longlong
        for name in ("nc_extract", "nc_extract_sq"):
            getattr(lib, name).argtypes = [p, i, i, i, i, p, p, p]
            getattr(lib, name).restype = None
        lib.nc_minmax.argtypes = [p, i, i, i, i, p, p]
        lib.nc_minmax.restype = None
        lib.nc_dot.argtypes = [p, i, i, p, i, i, i, i, p, p, p, p]
        lib.nc_dot.restype = None
        self.lib = lib

    @staticmethod
    def _rows(a: torch.Tensor) -> torch.Tensor:
        n = a.shape[-1]
        try:
            return a.view(-1, n)
        except RuntimeError:
            return a.reshape(-1, n)

    def minmax(self, a):
        a2 = self._rows(a)
        rows, n = a2.shape
        mx, mn = np.empty(rows), np.empty(rows)
        self.lib.nc_minmax(a2.data_ptr(), rows, n, a2.stride(0), a2.stride(1), mx.ctypes.data, mn.ctypes.data)
        shape = a.shape[:-1] + (1,)
        return mx.reshape(shape), mn.reshape(shape)

    def extract(self, a, k, square):
        a2 = self._rows(a)
        rows, n = a2.shape
        sig = np.ascontiguousarray(_pow2(k).reshape(-1))
        tau, t = np.empty(rows), np.empty(rows)
        fn = self.lib.nc_extract_sq if square else self.lib.nc_extract
        fn(a2.data_ptr(), rows, n, a2.stride(0), a2.stride(1), sig.ctypes.data, tau.ctypes.data, t.ctypes.data)
        shape = a.shape[:-1] + (1,)
        return tau.reshape(shape), t.reshape(shape)

    def dot(self, a, b, k):
        a2, b2 = self._rows(a), self._rows(b)
        rows, n = a2.shape
        sig = np.ascontiguousarray(_pow2(k).reshape(-1))
        tau, tr, te = np.empty(rows), np.empty(rows), np.empty(rows)
        self.lib.nc_dot(a2.data_ptr(), a2.stride(0), a2.stride(1), b2.data_ptr(), b2.stride(0), b2.stride(1),
                        rows, n, sig.ctypes.data, tau.ctypes.data, tr.ctypes.data, te.ctypes.data)
        shape = a.shape[:-1] + (1,)
        return tau.reshape(shape), tr.reshape(shape), te.reshape(shape)


def _build_clib():
    """Compile ``_C_SRC`` once per source/compiler into a cache directory and load it."""
    if os.environ.get("NORMCERT_NO_CEXT"):
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None
    cpu = _cpu_fingerprint()
    flags = _CFLAGS + (_NATIVE if cpu else ())
    key = hashlib.sha256("\0".join((_C_SRC, cc, *flags, platform.machine(), platform.system(), cpu)).encode())
    cache = Path(os.environ.get("NORMCERT_CACHE") or Path.home() / ".cache" / "normcert")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        cache = Path(tempfile.gettempdir()) / "normcert"
        cache.mkdir(parents=True, exist_ok=True)
    so = cache / f"fastsum-{key.hexdigest()[:20]}.so"
    if not so.exists():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src, out = Path(tmp) / "fastsum.c", Path(tmp) / "fastsum.so"
            src.write_text(_C_SRC)
            subprocess.run([cc, *flags, "-o", str(out), str(src)], check=True, capture_output=True, timeout=120)
            os.replace(out, so)  # atomic: concurrent builders each install a complete file
    return _CLib(so)


def _cpu_fingerprint() -> str:
    """model name + instruction-set flags of this cpu ('' where unknown: no -march=native then)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    except OSError:
        return ""
    return "".join(sorted(set(lines)))


def _clib():
    """The compiled helper, or None (no compiler, NORMCERT_NO_CEXT set, or it failed its self-test)."""
    if not _clib_state:
        lib = None
        try:
            lib = _build_clib()
            if lib is not None and not _self_test(lib):
                lib = None
        except Exception:  # no working compiler: the torch path computes the same sums
            lib = None
        _clib_state.append(lib)
    return _clib_state[0]


def _self_test(lib) -> bool:
    """The helper's extraction must be exact and its sums correctly rounded, as the torch path's are."""
    rng = np.random.default_rng(12345)
    a = rng.standard_normal((6, 37)) * 2.0 ** rng.integers(-30, 30, (6, 37))
    a[0, 1:] = -a[0, :-1]  # heavy cancellation
    a[1] = 1.0
    a[1, 0] = 2.0 ** -53  # a tie
    b = rng.standard_normal((6, 37))
    _clib_state.append(lib)
    try:
        sums = F64.row_sum(a)[:, 0]
        dots = F64.row_dot(a, b)[:, 0]
        sq = F64.row_dot(a, a)[:, 0]
        ok = all(sums[i] == _py_sum(a[i].tolist()) and dots[i] == _py_dot(a[i].tolist(), b[i].tolist())
                 and sq[i] == _py_dot(a[i].tolist(), a[i].tolist()) for i in range(a.shape[0]))
        k = _exps(np.max(a * a, axis=1, keepdims=True)) + (a.shape[1] + 1).bit_length()
        tau, _ = lib.extract(torch.from_numpy(a), k, True)
        ok = ok and bool(np.all(tau == ((_pow2(k) + a * a) - _pow2(k)).sum(axis=1, keepdims=True)))
    finally:
        _clib_state.clear()
    return ok


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
        return F64.row_peak(self.to_float64(a))

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


F64 = _Float64Exact()
MP = _MPExact()
BACKENDS = {"float64": F64, "mpmath": MP}
