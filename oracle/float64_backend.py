"""The float64 backend: numpy float64 arrays whose reductions are correctly rounded.

Values are numpy float64 arrays (the reductions run as torch float64 ops on the
same memory, or in ``native.c``).  Each row sum and row dot product is the exact
sum of its terms rounded once to nearest-even, on every finite row, always: a
cheap certificate decides when the fast path has the answer and otherwise an
exact slow path computes it (``sums``, ``exact``).  No one-pass variance, no
unscaled sum of squares.  Its own error is a few float64 ulps of each result's
natural scale, which the error model adds to every bound.  The interface is the
one in ``oracle.backends``; ``u = 2**-53``.

``row_dot``: ``sum a_i b_i`` first scales rows by powers of two only where
products could over- or underflow (every |a|, |b| row maximum outside
``2**±400``), splits each product exactly, ``a_i b_i = p_i + e_i`` (Dekker's
TwoProduct), extracts the ``p_i`` as ``sums`` does and adds ``fl(sum e_i)`` to
the remainder; the certificate's ``E`` also covers the bits lost to underflow
in TwoProduct or in the scaling.  Uncertified rows are computed exactly with
Python integers.  So ``row_dot`` is correctly rounded too.

``center`` gets ``S = sum a_i`` as the double-double ``hi + lo`` (within ``E``,
``sums.sum_dd``), the mean as ``mh + ml`` (``mh = fl(hi/n)``, ``ml`` from the
exact residual ``hi - n mh``), and ``d_i = fl(fl(a_i - mh) - ml)`` (the ``- ml``
is skipped when it cannot matter).  The certificate: the mean's error bound
plus any skipped ``ml`` is at most ``0.45 u`` times the row's spread
``max a - min a``; since ``max |d| >= spread / 2`` every ``d_i`` is then within
``4 u max|d|`` (plus ``2**-1072`` absolute).  Constant rows give ``d = 0``
exactly; uncertified rows take the slow path (mean of the exactly rounded sum,
then the exactly rounded mean of the residuals as a correction), accurate to a
few ``u max|d|`` as well.  ``hi + lo`` is not a correctly rounded sum, so the
low-order bits of the small ``d_i`` depend on the order in which ``sum_dd``
summed the remainders (torch's or ``native.c``'s), within that bound.

``inv_rms`` squares the row (pre-scaled by a power of two only where a square
could over- or underflow) and takes the correctly rounded sum of the squares:
``mean(a**2)`` is within ``3u`` of exact (each square rounded once, the sum
rounded once, the division by ``n``), and ``1 / sqrt(ms + eps)`` adds two
more roundings.

``pointwise`` evaluates an elementwise formula in float64 and re-evaluates,
exactly (with the mpmath backend), every element where float64 cannot be
trusted: a non-finite input or result, a result within ``2**-1000`` of 0 or
beyond ``2**1000`` (an intermediate may have flushed or overflowed), or where
the caller's ``risky`` says so; but not a result of ±inf that the caller's
``overflows`` proves is the exact value rounded (``proven_overflow``): a
filter, as in exact geometric predicates, that leaves mpmath the elements
float64 cannot decide.

NaN and ±Inf: rows holding a non-finite value are reduced in plain IEEE
arithmetic (``inf + -inf = nan``), which is what the exact value of the maths
is under IEEE conventions.
"""
from __future__ import annotations

import mpmath
import numpy as np
import torch

from . import native, special, sums
from .arrays import buf, np64, th
from .eft import U, exps, extract, pow2, scale_rows, split_th, two_prod, two_sum
from .exact import exact_sums, py_center, py_dot
from .mpmath_backend import MP, MP_PREC
from .sums import absmax, extremes, rounds_to_hi, sum_bounded, sum_dd, sum_dd_again

SAFE_EXP = 400  # rows whose max |.| lies in [2**-400, 2**400) are never scaled
LN2 = float(np.log(2.0))
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # ln 2 = HI + LO, HI with 32 bits


class Float64Exact:
    name = "float64"

    def array(self, a):
        return np.asarray(a, dtype=np.float64)

    def to_float64(self, a):
        return np64(a)

    exp = staticmethod(np.exp)

    @staticmethod
    def exp_times(t, *factors):
        """e**t times the factors, elementwise, rounded only where the result is formed: e**t =
        2**k e**r with r = t - k ln 2 in [-ln 2 / 2, ln 2 / 2] formed with ln 2 in two parts
        (Cody and Waite: k LN2_HI is exact for |k| < 2**20), each factor split as m 2**j (frexp,
        exact), the mantissas multiplied by e**r, then one ldexp.  So nothing under- or overflows
        before the result itself (e**-1000 times 10**300 is 10**-134, not 0 * 10**300), and the
        result is good to a few ulps (e**r, each product and the subnormal rounding of ldexp)."""
        t = np.asarray(t, dtype=np.float64)
        with np.errstate(all="ignore"):
            k = np.clip(np.rint(t / LN2), -2.0 ** 20, 2.0 ** 20)
            r = (t - k * LN2_HI) - k * LN2_LO
            mantissa, exponent = np.exp(r), k.astype(np.int64)
            for f in factors:
                m, j = np.frexp(np.asarray(f, dtype=np.float64))
                mantissa, exponent = mantissa * m, exponent + j
            return np.ldexp(mantissa, np.clip(exponent, -2 ** 30, 2 ** 30).astype(np.int32))

    ncdf = staticmethod(special.ncdf)
    npdf = staticmethod(special.npdf)
    sigmoid_cubic = staticmethod(special.sigmoid_cubic)

    def mul_add_(self, a, m, b=None):
        t = torch.from_numpy(a)  # torch: multi-threaded, and b + a*m in one pass
        m = torch.from_numpy(np.asarray(m, dtype=np.float64))
        if b is None:
            t.mul_(m)
        else:
            torch.addcmul(torch.from_numpy(np.asarray(b, dtype=np.float64)), t, m, out=t)
        return a

    def row_peak(self, a):
        return sums.row_peak(a)

    def pointwise(self, fn, *arrays, risky=None, scaled=False, overflows=None, tails=()):
        arrays = np.broadcast_arrays(*[np64(a) for a in arrays])
        with np.errstate(all="ignore"):
            out = np.array(fn(self, *arrays), dtype=np.float64)
            mag = np.abs(out)
            redo = ~np.isfinite(out)
            if not scaled:
                redo |= (mag > 2.0 ** 1000) | ((mag < 2.0 ** -1000) & (out != 0))
            if overflows is not None:
                redo &= ~overflows(out, *arrays)
            if risky is not None:
                redo |= risky(*arrays)
            for where, value in tails:  # value(B, *a) formed with no intermediate under- or overflow
                band = where(*arrays)
                if band.any():
                    out[band] = value(self, *[a[band] for a in arrays])
                    redo &= ~band
            for a in arrays:
                redo |= ~np.isfinite(a)
        if redo.any():
            with mpmath.workprec(MP_PREC):
                exact = fn(MP, *[MP.array(a[redo]) for a in arrays])
                out[redo] = MP.to_float64(exact)
        return out

    def row_sum(self, a):
        x = th(np64(a))
        n = x.shape[-1]
        if n == 0 or x.numel() == 0:
            return np.zeros(x.shape[:-1] + (1,))
        m = absmax(x)
        fin = np.isfinite(m)
        return sum_bounded(x, exps(m), fin, fin & (m == 0))

    def row_dot(self, a, b):
        a0, b0 = torch.broadcast_tensors(th(np64(a)), th(np64(b)))
        n = a0.shape[-1]
        lead = a0.shape[:-1]
        if n == 0 or a0.numel() == 0:
            return np.zeros(lead + (1,))
        ma, mb = absmax(a0), absmax(b0)
        fin = np.isfinite(ma) & np.isfinite(mb)
        zero = fin & ((ma == 0) | (mb == 0))
        ea, eb = exps(ma), exps(mb)
        scale = fin & ~zero & ((np.abs(ea) > SAFE_EXP) | (np.abs(eb) > SAFE_EXP))
        a1, b1 = a0, b0
        if scale.any():
            ka, kb = np.where(scale, ea, 0), np.where(scale, eb, 0)
            a1, b1 = scale_rows(a0, ka), scale_rows(b0, kb)
            ea, eb = ea - ka, eb - kb
        else:
            ka = kb = np.zeros_like(ea)
        G, L = (n + 1).bit_length(), (n - 1).bit_length()
        k = np.where(fin & ~zero, ea + eb + G, 0)
        with np.errstate(all="ignore"):
            lib = native.kernels()
            if lib is not None:
                tau, tr, te = lib.dot(a1, b1, k)
            else:
                p = torch.mul(a1, b1, out=buf(1, a1))
                ah, al = split_th(a1, 2)
                bh, bl = split_th(b1, 4)
                e = torch.mul(ah, bh, out=buf(6, a1))
                e.sub_(p)
                e.add_(ah.mul_(bl))  # ah is free after this: it holds the cross products from here
                e.add_(torch.mul(al, bh, out=ah))
                e.add_(torch.mul(al, bl, out=ah))
                del ah, al, bh, bl
                tau, tr, _ = extract(p, k)
                te = e.sum(-1, keepdim=True).numpy()
            hi, lo = two_sum(tau, tr + te)
            err = pow2(np.maximum(2 * L - 104 + k, L - 1070) + 1)
            ok = fin & ~zero & rounds_to_hi(hi, lo, err)
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
                    flat[i] = py_dot(a2[i].tolist(), b2[i].tolist())
                else:
                    flat[i] = float((a2[i] * b2[i]).sum())
        return out

    def scaled_sum(self, a, b):
        a, b = np64(a), np64(b)
        with np.errstate(all="ignore"):
            s = np.add(a, b)
            if s.size == 0:
                return s, np.ones(s.shape[:-1] + (1,))
            t = th(s)
            if bool(torch.isfinite(t.amax()) & torch.isfinite(t.amin())):
                return s, np.ones(s.shape[:-1] + (1,))
            over = (np.isinf(s) & np.isfinite(a) & np.isfinite(b)).any(axis=-1, keepdims=True)
            c = np.where(over, 0.5, 1.0)
            return np.where(over, a * 0.5 + b * 0.5, s), c

    def center(self, a):
        a = np64(a)
        x = th(a)
        n = x.shape[-1]
        lead = x.shape[:-1]
        if n == 0 or x.numel() == 0:
            return a.copy(), np.full(lead + (1,), np.nan)
        amax, amin = extremes(x)
        with np.errstate(all="ignore"):
            m = np.maximum(amax, -amin)
            fin = np.isfinite(m)
            const = fin & (amax == amin)  # includes all-zero rows: d = 0 exactly
            k = exps(m) + (n + 1).bit_length()
            fast = fin & ~const & (k <= 1022)
            k = np.where(fast, k, 0)
            room = 0.45 * U * (amax - amin)  # max|d| >= spread / 2
            hi, lo, err, tau, rem = sum_dd(x, k)
            mh, ml, m_err = mean_dd(hi, lo, err, n)
            ok = fast & (m_err <= room)
            again = np.flatnonzero((fast & ~ok).reshape(-1))
            if again.size:  # |mean| >> spread: one more extraction on those rows
                h2, l2, e2 = sum_dd_again(x, rem, k, tau, again)
                mh2, ml2, me2 = mean_dd(h2, l2, e2, n)
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
                m1 = (exact_sums(r) / n)[:, None]
                dd = r - m1  # exact where a_i is within a factor 2 of m1 (Sterbenz)
                cc = (exact_sums(dd) / n)[:, None]  # what rounding m1 and dd left behind
                d2[rows], m2[rows] = dd - cc, (m1 + cc)[:, 0]
                for i in np.flatnonzero(~np.isfinite(dd).all(axis=1)):  # a_i - m overflowed
                    d2[rows[i]], m2[rows[i]] = py_center(r[i].tolist())

    def inv_rms(self, a, eps):
        x = th(np64(a))
        n = x.shape[-1]
        lead = x.shape[:-1]
        eps = np64(eps)
        if n == 0 or x.numel() == 0:
            return np.full(lead + (1,), np.nan)
        with np.errstate(all="ignore"):
            m = absmax(x)
            fin = np.isfinite(m)
            e = exps(m)
            scale = fin & (np.abs(e) > SAFE_EXP)
            k = np.where(scale, e, 0)  # x 2**-k has max |.| in [1/2, 1) where scaled
            if scale.any():
                x = scale_rows(x, k)
            # squares are >= 0, so rounding each one costs at most u relative: no
            # cancellation can amplify it, and their sum is correctly rounded
            ms = sum_bounded(x, 2 * (e - k), fin, fin & (m == 0), square=True) / n
            # mean(a^2) + eps = (ms + eps 2**-2k) 2**2k
            r = np.ldexp(1.0 / np.sqrt(ms + np.ldexp(eps, -2 * k)), -k)
            direct = 1.0 / np.sqrt(np.ldexp(ms, 2 * k) + eps)  # where eps 2**-2k overflowed: eps dominates
            return np.where(np.isfinite(r) & (r > 0), r, direct)


def proven_overflow(out, low, *factors):
    """Where ``out`` is the infinity that p = |f_1 ... f_k| c rounds to in float64 (RNE), proven in
    float64: f_i the finite ``factors`` (k <= 3), c >= ``low`` >= 0 a positive factor the caller bounds,
    p's sign that of the product of the f_i.

    With f_i = m_i 2**e_i (frexp, 1/2 <= |m_i| < 1), P = fl(...fl(|m_1| |m_2|)... |m_k|) has k - 1
    roundings, so |m_1 ... m_k| >= P (1 - (k - 1) u), u = 2**-53; L = fl(fl(P low) (1 - 2**-46)) <=
    P low (1 + u)**2 (1 - 2**-46) <= P low (1 - (k - 1) u) (2**-46 > (k + 1) u).  So p >= L 2**E,
    E = sum e_i, and ldexp (exact, then rounded once) gives inf exactly where L 2**E >= 2**1024 -
    2**970, the RNE overflow threshold, which p then passes too: its rounding is inf, of that sign.
    mpmath's float() rounds the same way, so these elements need no redo."""
    m = [np.frexp(f) for f in factors]
    P = np.ones_like(out)
    for mi, _ in m:
        P = P * np.abs(mi)
    E = sum(e.astype(np.int64) for _, e in m)
    L = P * low * (1 - 2.0 ** -46)
    negative = np.zeros(out.shape, bool)
    for f in factors:
        negative ^= np.signbit(f)
    finite = np.logical_and.reduce([np.isfinite(f) for f in factors])
    with np.errstate(over="ignore"):
        return finite & np.isinf(out) & (np.signbit(out) == negative) & np.isinf(np.ldexp(L, E))


def mean_dd(hi, lo, err, n):
    """(mh, ml, bound): |(hi + lo) / n - (mh + ml)| + err / n <= bound."""
    s = np.where(np.abs(hi) > 2.0 ** 960, 2.0 ** -128, 1.0)  # keeps the split finite
    hs, ls = hi * s, lo * s
    mhs = hs / n
    p, pe = two_prod(mhs, float(n))  # hs - p is exact (Sterbenz)
    mls = (((hs - p) - pe) + ls) / n
    mh, ml = mhs / s, mls / s
    return mh, ml, 2.0 * err / n + 10.0 * U * U * np.abs(mh) + 2.0 ** -1072


F64 = Float64Exact()
