"""Floating-point formats of the four dtypes normcert certifies, and of float8_e4m3fn and int8 outputs.

A format with ``p`` significand bits (hidden bit included) and minimum normal
exponent ``emin`` has

* unit roundoff        u      = 2**-p           (round-to-nearest relative error bound)
* smallest normal      lam    = 2**emin
* subnormal spacing    tiny   = 2**(emin - p + 1)
* ulp(v)                      = 2**(max(floor(log2|v|), emin) - p + 1)

``round_to`` rounds float64 values to a format with round-to-nearest-even,
directly from float64.  torch's own float64 -> bfloat16 cast goes through
float32 and so rounds twice (1 + 2**-8 + 2**-40 becomes 1.0 instead of
1 + 2**-7); the oracle never uses it.

``E4M3`` (torch.float8_e4m3fn) is an *output* format only (the fused FP8
quantisation ops): p = 4, emin = -6, and no infinities -- the top pattern of the
top binade is NaN, so the largest finite value is 448, not (2 - 2**-3) 2**8.
Rounding to it *saturates*: RNE, then any magnitude past 448 (±inf included)
becomes ±448; NaN stays NaN (the ``satfinite`` conversion of a GPU, and torch's
cast).

``E2M1`` (FP4, the NVFP4 / MXFP4 element) is an output format the same way: p = 2, emin = 0,
emax = 2, values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, nearest even, saturating at +-6, no NaN (so a NaN
has no E2M1 value: ``round`` keeps it and the claim about it is the caller's, ``bounds_quant``).
Kernels store it packed, two codes to a byte (``fp4``); ``torch.float8_e8m0fnu`` (an MXFP4 block
scale) is checked in ``UE8M0``.
"""
from __future__ import annotations

from dataclasses import dataclass

import mpmath
import numpy as np
import torch


@dataclass(frozen=True)
class Format:
    name: str
    p: int  # significand bits, hidden bit included
    emin: int
    emax: int
    largest: float | None = None  # the largest finite value, where not (2 - 2**(1-p)) 2**emax
    saturates: bool = False  # rounding past the largest finite value gives it, not inf

    @property
    def u(self) -> float:
        return 2.0 ** -self.p

    @property
    def lam(self) -> float:
        return 2.0 ** self.emin

    @property
    def max(self) -> float:
        return self.largest if self.largest is not None else (2.0 - 2.0 ** (1 - self.p)) * 2.0 ** self.emax

    def ulp(self, v: np.ndarray) -> np.ndarray:
        """ulp of each |v| in this format (the subnormal spacing ``tiny`` for zero and subnormals)."""
        v = np.abs(np.asarray(v, dtype=np.float64))
        _, e = np.frexp(np.where(np.isfinite(v), v, 1.0))  # frexp(0) gives e = 0
        e = np.where(v > 0, e - 1, self.emin)
        return np.ldexp(1.0, np.maximum(e, self.emin) - self.p + 1)

    def rank(self, v: np.ndarray) -> np.ndarray:
        """The signed position of each value v of this format among its values (0 for zero, k for
        the k-th value above it): the difference of two ranks counts the steps between them."""
        v = np.asarray(v, dtype=np.float64)
        a = np.abs(np.where(np.isfinite(v), v, 0.0))
        _, e = np.frexp(a)
        half = 2.0 ** (self.p - 1)
        r = np.where(a < self.lam, a / self.ulp(0.0), (e - self.emin) * half + a / self.ulp(a) - half)
        return np.copysign(r, v)

    def rounding_interval(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi): the closed interval of reals that round to each value q of this format, its
        midpoints with the neighbours (a tie is counted on both sides); for a saturating format
        the interval of ±max reaches ±inf.  NaN for NaN; ±inf for ±inf."""
        q = np.asarray(q, dtype=np.float64)
        a = np.abs(q)
        with np.errstate(all="ignore"):
            up = self.ulp(a) / 2
            down = np.where(a > 0, self.ulp(np.nextafter(a, 0.0)) / 2, up)  # the binade below at a power of 2
            top = a >= self.max
            up = np.where(top, np.inf if self.saturates else up, up)
            lo = np.where(q >= 0, q - down, q - up)
            hi = np.where(q >= 0, q + up, q + down)
            lo = np.where(np.isinf(q), q, lo)
            hi = np.where(np.isinf(q), q, hi)
        return lo, hi

    def round(self, v: np.ndarray) -> np.ndarray:
        """Round float64 values to this format, nearest-even; past the largest finite value,
        ±inf (or, for a saturating format, ±max, infinite inputs included)."""
        v = np.asarray(v, dtype=np.float64)
        if self.p == 53:
            return v.copy()
        finite = np.isfinite(v) & (v != 0)
        safe = np.where(finite, v, 1.0)
        _, e = np.frexp(safe)
        q = np.maximum(e - 1, self.emin) - self.p + 1  # exponent of the target ulp
        r = np.ldexp(np.rint(np.ldexp(safe, -q)), q)  # rint is nearest-even; scaling is exact
        r = np.where(np.abs(r) > self.max, np.copysign(np.inf, safe), r)
        r = np.where(finite, r, v)
        return np.clip(r, -self.max, self.max) if self.saturates else r  # clip keeps NaN


@dataclass(frozen=True)
class IntegerFormat:
    """A signed integer output format (int8 quantisation), with the ``Format`` methods the
    assessment uses: values are the integers in [lo, hi]; rounding is to nearest, ties to even,
    and saturating (past hi, +inf included, hi; below lo, lo); NaN has no integer, so it stays
    NaN here and a claim about it is the caller's (``bounds_quant``: none)."""

    name: str
    lo: int
    hi: int
    saturates: bool = True

    @property
    def max(self) -> float:
        return float(self.hi)

    def ulp(self, v: np.ndarray) -> np.ndarray:
        return np.ones(np.shape(v))

    def rank(self, v: np.ndarray) -> np.ndarray:
        return np.asarray(v, dtype=np.float64)

    def rounding_interval(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[q - 1/2, q + 1/2], open-ended at the saturating ends lo and hi."""
        q = np.asarray(q, dtype=np.float64)
        return np.where(q <= self.lo, -np.inf, q - 0.5), np.where(q >= self.hi, np.inf, q + 0.5)

    def round(self, v: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(np.asarray(v, dtype=np.float64)), self.lo, self.hi)  # rint: ties to even; clip keeps NaN


@dataclass(frozen=True)
class PowerOfTwoFormat:
    """UE8M0, the OCP MX block-scale format: an 8-bit biased exponent, no sign, no significand, so
    its values are the powers of two 2**k, k in [emin, emax] (stored here in float32, whose range
    holds them all).  A block scale is rounded *up* into it, so that the block's peak never
    saturates after the division (``round``: 2**ceil(log2 v)); ``rounding_interval`` is then
    (2**(k-1), 2**k] for 2**k (closed here, as for the other formats: a tie counts on both sides),
    and empty ([inf, -inf]) for a value that is not a power of two: no real rounds to it.  With
    these methods a scale stored in UE8M0 is assessed as a quantised output (``assessment.assess``)."""

    name: str = "ue8m0"
    emin: int = -127
    emax: int = 127
    saturates: bool = True

    @property
    def max(self) -> float:
        return 2.0 ** self.emax

    def _exponent(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(k, is a power of two in range) for each v (k meaningless where not)."""
        v = np.asarray(v, dtype=np.float64)
        m, e = np.frexp(np.where(np.isfinite(v) & (v > 0), v, 1.0))
        k = e - 1
        return k, np.isfinite(v) & (v > 0) & (m == 0.5) & (k >= self.emin) & (k <= self.emax)

    def ulp(self, v: np.ndarray) -> np.ndarray:
        return np.abs(np.asarray(v, dtype=np.float64))  # the step above 2**k is 2**k

    def rank(self, v: np.ndarray) -> np.ndarray:
        """log2 v (steps of the format count exponents; a value that is not a power of two lies
        between two ranks), 0 where v is not a positive finite number."""
        v = np.asarray(v, dtype=np.float64)
        with np.errstate(all="ignore"):
            return np.where(np.isfinite(v) & (v > 0), np.log2(np.where(v > 0, v, 1.0)), 0.0)

    def rounding_interval(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(q, dtype=np.float64)
        k, ok = self._exponent(q)
        lo = np.where(k == self.emin, 0.0, np.ldexp(1.0, k - 1))  # everything below the least rounds up to it
        hi = np.where(k == self.emax, np.inf, q)  # and everything past the largest saturates to it
        nan = np.isnan(q)
        return np.where(ok, lo, np.where(nan, np.nan, np.inf)), np.where(ok, hi, np.where(nan, np.nan, -np.inf))

    def round(self, v: np.ndarray) -> np.ndarray:
        """2**ceil(log2 v), clamped to [2**emin, 2**emax]; NaN stays NaN (v >= 0: a scale)."""
        v = np.asarray(v, dtype=np.float64)
        m, e = np.frexp(np.where(np.isfinite(v) & (v > 0), v, 1.0))
        k = np.where(m == 0.5, e - 1, e)
        r = np.ldexp(1.0, np.clip(k, self.emin, self.emax))
        r = np.where(v > 0, r, 2.0 ** self.emin)
        r = np.where(np.isposinf(v), self.max, r)
        return np.where(np.isnan(v), np.nan, r)


FORMATS: dict[torch.dtype, Format] = {
    torch.float64: Format("float64", 53, -1022, 1023),
    torch.float32: Format("float32", 24, -126, 127),
    torch.float16: Format("float16", 11, -14, 15),
    torch.bfloat16: Format("bfloat16", 8, -126, 127),
}
E4M3 = Format("float8_e4m3fn", 4, -6, 8, largest=448.0, saturates=True)
E2M1 = Format("float4_e2m1", 2, 0, 2, largest=6.0, saturates=True)
INT8 = IntegerFormat("int8", -128, 127)
UE8M0 = PowerOfTwoFormat()
OUTPUT_FORMATS: dict[torch.dtype, Format | IntegerFormat] = {**FORMATS, torch.float8_e4m3fn: E4M3,
                                                             torch.int8: INT8,
                                                             torch.float8_e8m0fnu: UE8M0}  # what an output may be
DTYPES = tuple(FORMATS)
DTYPE_NAMES = {d: f.name for d, f in FORMATS.items()}
BY_NAME = {f.name: d for d, f in FORMATS.items()}


def fmt(dtype: torch.dtype) -> Format | IntegerFormat:
    """The format of a certified dtype, or of an output-only one (float8_e4m3fn, int8)."""
    return OUTPUT_FORMATS[dtype]


def compute_format(dtype: torch.dtype) -> Format:
    """The precision a correct kernel computes in: float64 for float64, else float32."""
    return FORMATS[torch.float64 if dtype == torch.float64 else torch.float32]


def toward_exact(v: np.ndarray, exact, form) -> np.ndarray:
    """``v`` (float64, each the exact value rounded to nearest) with every element that lands on a
    boundary of ``form``'s rounding (a midpoint; for a rounding up, a value of the format) which its
    exact value ``exact(i)`` (an mpmath number, by index) is not on, moved one float64 ulp towards
    it, in place: so that ``form.round(v)`` rounds the exact value, not v (rounding twice, exact ->
    float64 -> format, would break the tie its own way)."""
    with np.errstate(all="ignore"):
        tie = np.isfinite(v) & (form.round(np.nextafter(v, -np.inf)) != form.round(np.nextafter(v, np.inf)))
    for i in zip(*np.nonzero(tie)):
        side = exact(i) - mpmath.mpf(float(v[i]))
        if side:
            v[i] = np.nextafter(v[i], np.inf if side > 0 else -np.inf)
    return v


def to_float64(t: torch.Tensor) -> np.ndarray:
    """Exact float64 copy of a tensor of any dtype in OUTPUT_FORMATS (every value is representable)."""
    return t.detach().to("cpu", torch.float64).numpy().copy()


_INTS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of ``t``: a same-width signed integer view (of t itself where t is contiguous)."""
    return t.contiguous().view(_INTS[t.element_size()])
