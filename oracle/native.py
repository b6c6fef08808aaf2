"""The optional compiled helper: the same extraction and TwoProduct as the torch path, one pass each.

``kernels()`` compiles ``_C_SRC`` once per source, compiler and cpu into a
cache directory, loads it and self-tests it; None where that fails (the torch
path computes the same sums) or ``NORMCERT_NO_CEXT`` is set.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from .eft import exps, pow2
from .exact import py_dot, py_sum

_C_SRC = r"""
/* normcert: one-pass error-free extraction kernels for oracle/sums.py and oracle/float64_backend.py.
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
_clib_state: list = []  # [] not tried yet; [None] unavailable; [Kernels] loaded


class Kernels:
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
        sig = np.ascontiguousarray(pow2(k).reshape(-1))
        tau, t = np.empty(rows), np.empty(rows)
        fn = self.lib.nc_extract_sq if square else self.lib.nc_extract
        fn(a2.data_ptr(), rows, n, a2.stride(0), a2.stride(1), sig.ctypes.data, tau.ctypes.data, t.ctypes.data)
        shape = a.shape[:-1] + (1,)
        return tau.reshape(shape), t.reshape(shape)

    def dot(self, a, b, k):
        a2, b2 = self._rows(a), self._rows(b)
        rows, n = a2.shape
        sig = np.ascontiguousarray(pow2(k).reshape(-1))
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
    return Kernels(so)


def _cpu_fingerprint() -> str:
    """model name + instruction-set flags of this cpu ('' where unknown: no -march=native then)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    except OSError:
        return ""
    return "".join(sorted(set(lines)))


def kernels():
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
    from .float64_backend import F64  # noqa: PLC0415 - the backend imports this module

    _clib_state.append(lib)
    try:
        sums = F64.row_sum(a)[:, 0]
        dots = F64.row_dot(a, b)[:, 0]
        sq = F64.row_dot(a, a)[:, 0]
        ok = all(sums[i] == py_sum(a[i].tolist()) and dots[i] == py_dot(a[i].tolist(), b[i].tolist())
                 and sq[i] == py_dot(a[i].tolist(), a[i].tolist()) for i in range(a.shape[0]))
        k = exps(np.max(a * a, axis=1, keepdims=True)) + (a.shape[1] + 1).bit_length()
        tau, _ = lib.extract(torch.from_numpy(a), k, True)
        ok = ok and bool(np.all(tau == ((pow2(k) + a * a) - pow2(k)).sum(axis=1, keepdims=True)))
    finally:
        _clib_state.clear()
    return ok

