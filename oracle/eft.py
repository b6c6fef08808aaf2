"""Error-free transformations in binary64 (round to nearest-even, no FMA contraction).

Each one rewrites a value as an unevaluated sum of floats that is *exactly*
equal to it, barring overflow and underflow.  ``u = 2**-53``.

``two_sum(a, b) = (s, e)``   s = fl(a + b), e = (a + b) - s exactly, any a, b
                              (Knuth's TwoSum, six operations, no branch).
``split(a) = (hi, lo)``      a = hi + lo, each with at most 26 significant
                              bits (Veltkamp's splitter c = 2**27 + 1:
                              hi = fl(c a) - fl(fl(c a) - a); |a| < 2**996 so
                              that c a does not overflow).
``two_prod(a, b) = (p, e)``  p = fl(a b), e = a b - p exactly (Dekker: the
                              products of the 26-bit halves are exact, and so
                              is each step of e = ((ah bh - p) + ah bl + al bh)
                              + al bl).
``extract(a, k)``             with sigma = 2**k per row and 2**k >= (n + 2)
                              max|a_i| (Rump, Ogita & Oishi's ExtractVector):
                              q_i = fl(fl(sigma + a_i) - sigma) is a_i rounded
                              to the grid 2**(k-53), |sum q| < sigma, so the
                              float sum tau of the q_i is exact in any order;
                              r_i = a_i - q_i is exact, |r_i| <= 2**(k-53).
``scale_rows(a, k)``          a 2**-k per row, exact unless a result is
                              subnormal.

``split_th`` and ``extract`` are the torch versions the float64 backend runs on
whole tensors (into scratch buffers); ``two_sum``, ``split`` and ``two_prod``
work on numpy arrays or Python floats.
"""
from __future__ import annotations

import numpy as np
import torch

from .arrays import buf

U = 2.0 ** -53
SPLIT = 134217729.0  # 2**27 + 1, Veltkamp's splitter for binary64


def pow2(k) -> np.ndarray:
    """2**k for integer arrays k in [-1074, 1023]."""
    return np.ldexp(1.0, np.asarray(k, dtype=np.int64))


def exps(m: np.ndarray) -> np.ndarray:
    """e with m < 2**e for finite m >= 0 (0 for m == 0 and non-finite m)."""
    _, e = np.frexp(np.where(np.isfinite(m), m, 0.0))
    return e.astype(np.int64)


def scale_rows(a: torch.Tensor, k: np.ndarray) -> torch.Tensor:
    """a * 2**-k per row, in two steps so each factor is representable."""
    k1 = -(k // 2)
    k2 = -k - k1
    out = torch.mul(a, torch.from_numpy(pow2(k1)))
    return out.mul_(torch.from_numpy(pow2(k2)))


def two_sum(a, b):
    s = a + b
    z = s - a
    return s, (a - (s - z)) + (b - z)


def split(a):
    c = SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    """p + e == a * b exactly (Dekker), barring over/underflow."""
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def split_th(a: torch.Tensor, slot: int):
    """Veltkamp's split a = hi + lo, each with at most 26 significant bits (|a| < 2**996).

    hi and lo live in scratch slots ``slot`` and ``slot + 1``.
    """
    hi = torch.mul(a, SPLIT, out=buf(slot, a))
    t = torch.sub(hi, a, out=buf(slot + 1, a))
    hi.sub_(t)
    torch.sub(a, hi, out=t)
    return hi, t


def extract(a: torch.Tensor, k: np.ndarray):
    """One extraction at sigma = 2**k per row, with torch ops.

    Returns (tau, t, rem): tau the exact sum of the parts of ``a`` on the grid
    2**(k-53), rem the (exact) remainders (in scratch slot 0), t = fl(sum rem).
    """
    sig = torch.from_numpy(pow2(k))
    q = torch.add(a, sig, out=buf(0, a))
    q.sub_(sig)
    tau = q.sum(-1, keepdim=True)
    torch.sub(a, q, out=q)
    return tau.numpy(), q.sum(-1, keepdim=True).numpy(), q
