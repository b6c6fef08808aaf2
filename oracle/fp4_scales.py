r"""The block-scale rules of FP4 as real libraries ship them: two contract choices (argument kinds
"mx_scale" and "block_floor", ``kinds``), each a rounding R of the exact block scale S = A / (6 g)
(``fp4``: A the block's amax, g the global scale) into the scale's format, with the interval of S
that rounds to each stored value (what the check needs: ``assessment.assess`` passes a kernel's
scale s iff some value within the bound of S rounds to it).

mx_scale (MXFP4's shared exponent, UE8M0; ``MX_SCALES``), with a = A / g = 6 S, s = 2**k, k clamped
to [-127, 127] (UE8M0's range; a = 0 gives 2**-127):

    rceil  k = ceil(log2 S) = ceil(log2(a / 6)): cuBLAS's "RCEIL" (its D-block quantisation: the
           ``cvt.rp.satfinite.ue8m0x2`` of Blackwell), TransformerEngine, torchao's RCEIL.  a / s is
           in (3, 6]: the peak never saturates.  S rounds to 2**k iff S in (2**(k-1), 2**k].
    floor  k = floor(log2 a) - 2 (2 = emax of E2M1): OCP MX 1.0 section 6.3, the spec's rule
           (X = 2**(floor(log2 amax) - emax_elem), elements then clamped to the largest normal,
           6), torchao's FLOOR (its default).  a / s is in [4, 8): a block's peak past 6 saturates to
           6.  2**k iff a in [2**(k+2), 2**(k+3)), S in [2**(k+2) / 6, 2**(k+3) / 6).
    ceil   k = ceil(log2 a) - 2: torchao's CEIL (the exponent of a, up one where its significand
           is not 1).  a / s in (2, 4]: never saturates, the top code 6 unused.  2**k iff a in
           (2**(k+1), 2**(k+2)], S in (2**(k+1) / 6, 2**(k+2) / 6].
    even   k = floor(log2 rnd(a)) - 2, rnd rounding a's significand m in [1, 2) to E2M1's one
           mantissa bit, halves up: the exponent up one where m >= 1.75 (torchao's EVEN: a's float32
           bits plus 2**21, masked to the exponent; Modular MAX's mxfp4 "even" scale).  a / s in
           [3.5, 7): the peak saturates where a / s > 6.  2**k iff a in [3.5 2**k, 7 2**k), S in
           [3.5 2**k / 6, 7 2**k / 6).

The default (a kernel declaring no mx_scale) is rceil.  The OCP spec names floor, but rceil is
what normcert's MXFP4 contract has meant since the op was adopted (a certificate that names no
mx_scale keeps its meaning), what the hardware conversion and cuBLAS's block-scaled GEMMs compute,
and the only rule under which no element saturates, so that y is E2M1(v / (s g)) with the exact
peak in (3, 6]; the spec's rule is one key away (``mx_scale=floor``) and the certificate names it.

block_floor (NVFP4's E4M3 block scale; ``BLOCK_FLOORS``): "none" (the default: R = E4M3, nearest
even, a scale below 2**-10 rounding to 0 and its block all zeros, TransformerEngine's recipe) or
"2^-6": R(S) = E4M3(max(S, 2**-6)), the clamp to E4M3's smallest normal before the cast that
torchao's ``nvfp4_quantize`` makes; a block whose S is below 2**-6 then gets the scale 2**-6 and
its values are quantised against it, never 0 for want of a scale.  The stored value 2**-6 is then
reached from every S in [0, 2**-6 + 2**-10) (its rounding interval reaches down to 0), and no
smaller E4M3 value is reachable (an empty interval).

For every rule R is non-decreasing in S, so the kernel's scale is correct iff it lies in
[R(S - B_s), R(S + B_s)] (``bounds_quant.block``), the bound B_s unchanged: it is on the kernel's
S before its rounding, whatever the rounding is.  The element check divides by the kernel's own
scale and rounds to E2M1 saturating, so a floor or even scale whose peak passes 6 needs nothing
more: E2M1(a / s) = 6 there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import E4M3, UE8M0, Format, PowerOfTwoFormat

MX_SCALES = ("rceil", "floor", "ceil", "even")  # the first the default
BLOCK_FLOORS = ("none", "2^-6")  # the first the default
FLOOR_VALUES = {"none": None, "2^-6": 2.0 ** -6}
MX_GLOBAL_SCALES = ("none", "taken")  # an MXFP4 kernel called with global_scale 1, or fitted another

LOWEST = {"floor": 4.0, "ceil": 2.0, "even": 3.5}  # a = 6 S in [c 2**k, 2 c 2**k) gives 2**k (module docstring)


@dataclass(frozen=True)
class SharedExponent(PowerOfTwoFormat):
    """UE8M0 under one of the ``MX_SCALES`` rules (module docstring); "rceil" is ``UE8M0`` itself."""

    mode: str = "rceil"

    def _k(self, a: np.ndarray) -> np.ndarray:
        """k of the rule for a = 6 S > 0 finite (unclamped)."""
        m, e = np.frexp(a)  # a = m 2**e, m in [0.5, 1)
        if self.mode == "floor":
            return e - 1 - 2
        if self.mode == "ceil":
            return np.where(m == 0.5, e - 1, e) - 2
        return e - 1 + (m >= 0.875) - 2  # even: the significand 2m >= 1.75 carries

    def round(self, v: np.ndarray) -> np.ndarray:
        if self.mode == "rceil":
            return super().round(v)
        v = np.asarray(v, dtype=np.float64)
        ok = np.isfinite(v) & (v > 0)
        with np.errstate(all="ignore"):
            k = self._k(np.where(ok, 6.0 * v, 1.0))
        r = np.ldexp(1.0, np.clip(k, self.emin, self.emax))
        r = np.where(ok, r, np.where(np.isposinf(v), self.max, 2.0 ** self.emin))
        return np.where(np.isnan(v), np.nan, r)

    def rounding_interval(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.mode == "rceil":
            return super().rounding_interval(q)
        q = np.asarray(q, dtype=np.float64)
        k, ok = self._exponent(q)
        c = LOWEST[self.mode]
        with np.errstate(all="ignore"):  # widened a float64 ulp outward: the /6 is rounded
            lo = np.nextafter(np.ldexp(c, k) / 6.0, 0.0)
            hi = np.nextafter(np.ldexp(2 * c, k) / 6.0, np.inf)
        lo = np.where(k == self.emin, 0.0, lo)
        hi = np.where(k == self.emax, np.inf, hi)
        nan = np.isnan(q)
        return np.where(ok, lo, np.where(nan, np.nan, np.inf)), np.where(ok, hi, np.where(nan, np.nan, -np.inf))


@dataclass(frozen=True)
class Floored:
    """A scale format whose rounding first clamps S to at least ``floor`` (a value of ``base``):
    R(S) = base.round(max(S, floor)); ``base``'s otherwise (module docstring)."""

    base: Format
    floor: float

    def __getattr__(self, name):  # u, p, max, ulp, rank, saturates: the base format's
        if name in ("base", "floor"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def round(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        return self.base.round(np.where(np.isnan(v), v, np.maximum(v, self.floor)))

    def rounding_interval(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(q, dtype=np.float64)
        lo, hi = self.base.rounding_interval(q)
        least = float(self.base.round(np.float64(self.floor)))
        below = q < least  # no S rounds there any more
        return np.where(q == least, -np.inf, np.where(below, np.inf, lo)), np.where(below, -np.inf, hi)


def scale_format(block_format: str, mx_scale: str | None = None, block_floor: str | None = None):
    """The rounding of a block scale (a ``formats`` format's methods) for ``block_format`` under
    the declared rules (None: the default): E4M3, clamped below where ``block_floor`` says, for
    "nvfp4"; UE8M0 under ``mx_scale`` for "mxfp4"."""
    if block_format == "nvfp4":
        floor = FLOOR_VALUES[block_floor or BLOCK_FLOORS[0]]
        return E4M3 if floor is None else Floored(E4M3, floor)
    mode = mx_scale or MX_SCALES[0]
    return UE8M0 if mode == "rceil" else SharedExponent(mode=mode)


__all__ = ["BLOCK_FLOORS", "FLOOR_VALUES", "MX_GLOBAL_SCALES", "MX_SCALES", "Floored", "SharedExponent", "scale_format"]
