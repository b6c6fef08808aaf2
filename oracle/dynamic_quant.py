"""An op quantised with a scale per row that it computes itself (dynamic per-token quantisation),
from the op it quantises: vLLM's ``rms_norm_dynamic_per_token_quant`` (f = rms_norm) and its fused
form with the residual add, SGLang's fused add + RMSNorm + per-token quant.

Per row r, with v = f(args)[0] (the exact real value) and q = qdtype's largest value:

    A_r      = max_i |v_ri|
    scale_r  = max(min(A_r, scale_ub) / q, F),   F = MIN_SCALE / q = 1 / (512 q) by default
    y_ri     = Q(v_ri / scale_r)
    op(args, qdtype, scale_ub) = (y, scale, f's other outputs)

Per group (``group_forward``, vLLM's ``rms_norm_per_block_quant``, DeepSeek's 1 x 128 activations,
OCP MX): the same with a group of ``group`` consecutive elements of a row for the row, no scale_ub,
and the scale stored as "float32" (as above) or "ue8m0": P(max(A_g / q, F)), P rounding
up to a power of two (``formats.UE8M0``), so that no group's peak saturates.

The tail rule, a contract choice the kernel declares (argument kind "tail", ``TAILS``, set by its
domain's ``tail=``, never passed to it; ``group_forward``): "none" (the default, None) requires the
row (the output row of a [gate | up] op) to be a multiple of ``group``, a ValueError naming
``group`` otherwise; "partial" admits any row length n: a row has G = ceil(n / group) groups, group
j of elements [j group, min((j + 1) group, n)), so the last one holds n - (G - 1) group elements
(fewer than ``group`` where group does not divide n) and its scale is of its own amax, A_G-1 =
max |v_i| over those elements alone, as any group's.  The scales are (..., G) in either layout:
scale (r, j) of flat row r at r G + j ("row_major") or at j R + r ("column_major", R rows), G the
partial count.

qdtype, by name (``QDTYPES``): "float8_e4m3fn" (q = 448; Q rounds to nearest even and saturates
at +-448, ``formats.E4M3``) or "int8" (q = 127; Q rounds to the nearest integer, ties to even, and
saturates to [-128, 127], ``formats.INT8``).  scale_ub: None (no bound) or a positive finite float:
rows whose amax passes it saturate.  The floor F keeps an all-zero row's scale positive: its y is
0, not 0 / 0.  F is a contract choice the kernel declares (argument kind "scale_floor",
``SCALE_FLOORS``, set by its domain's ``scale_floor=`` or ``amax_floor=``, never passed to it;
``floor``, ``read_floor``):

    "1/512q" (the default, None)  F = MIN_SCALE / q, vLLM's ``min_scaling_factor``: 1 / (448 * 512)
             for float8, 1 / (127 * 512) for int8 (the amax floor a = 1/512 below)
    "eps32"  F = 2**-23, float32's machine epsilon, whatever q (the floor some int8 paths clamp to)
    "amax:a" (domain ``amax_floor=a``)  F = f32(a) / q: the amax floored before the division,
             scale = max(A, a) / q, as vLLM's ``per_token_group_quant_fp8`` and
             ``_silu_mul_fp8_quant_deep_gemm`` and SGLang's ``silu_and_mul_masked_post_quant_fwd``
             compute it with a = 1e-10 (vLLM: "minimum to avoid dividing zero"); max(A, a) / q =
             max(A / q, a / q) exactly, so it is this formula with F = a / q
    "a"      (domain ``scale_floor=a``, a number)  F = f32(a): the scale itself floored at a

f32(a) is the positive finite a rounded once to float32, the constant as a kernel holds it (a Triton
literal, a C float): the floor's own rounding is no error of the kernel's.  Each F is one float64
number (a power of two, or MIN_SCALE or f32(a) over q rounded once to float64 like the rest of the
scale), so the bounds (``bounds_quant``) hold for every F unchanged: max(., F) is 1-Lipschitz.  The
scales are float32, one per row (x.shape[:-1]), as vLLM and SGLang return them.

NaN policy, a contract choice the kernel declares (argument kind "nan", ``NAN_POLICIES``; never passed
to the kernel: its domain's ``nan=`` sets it, ``properties.declared.domain``):

    "propagate" (the default, None)  A_r = max_i |v_ri| is NaN where the row holds a NaN (f's NaN
             policy: a NaN or inf in the row), and so is scale_r (the max propagates it)
    "ignore"   the max is IEEE 754-2019 maximumNumber, which drops a NaN (Triton's ``tl.max`` by
             default, and so vLLM's and SGLang's Triton quant kernels): A_r = max over the i with
             v_ri not NaN of |v_ri|, 0 where there is none (a row all NaN: its scale is the floor)
    "unspecified"  no claim: a row, group or block whose exact v holds a NaN is outside the contract,
             its scale and every y of it unchecked (``bounds_quant``: bound -inf), every other one
             checked as under "propagate" (the oracle computes it so); what most real kernels
             document, where a NaN activation is a failure upstream (their amax may keep it, drop it
             or give any finite scale)

Either way y_ri = Q(v_ri / scale_r) keeps NaN where v_ri is NaN: float8 keeps it (its NaN encoding),
int8 has no NaN and no claim is made on y there.  The same choice holds for every amax normcert
takes: a group's (``group_forward``) and an FP4 block's (``fp4``).

The oracle's outputs are v / scale (before Q: consumers round, as for the static FP8 ops) and the
exact scale, each rounded once to float64; where the scale is infinite (an infinite v, or a peak past
float64's range) v / scale is NaN: no value, and no claim on the group (``bounds_quant``).  The accuracy check divides v by the kernel's own scale
instead (``record.Out.scale``, ``bounds_quant``): a kernel computes its scale from its own rounded
v, within its bound of the exact one but not equal to it, and y is then Q(v / its scale); checked
against Q(v / exact scale) a correct kernel would fail wherever the two straddle a midpoint of Q.
The scale itself is checked against the exact scale under its bound.  No backward: these are
inference ops.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .formats import UE8M0, fmt
from .sums import row_peak

QDTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "int8": torch.int8}
MIN_SCALE = 1 / 512  # times 1 / q: the floor of a row's scale
NAN_POLICIES = ("propagate", "ignore", "unspecified")  # an amax that keeps a NaN, drops it, or no claim
SCALE_FLOORS = ("1/512q", "eps32")  # the named floors: MIN_SCALE / q, float32's epsilon (a value: read_floor)
EPS32 = float(torch.finfo(torch.float32).eps)  # 2**-23
SCALE_FORMATS = ("float32", "ue8m0")  # a group's scale as computed, or rounded up to a power of two
TAILS = ("none", "partial")  # rows a multiple of the group, or a last group shorter, with its own scale


def qmax(qdtype: str) -> float:
    """The largest value of the quantised format named ``qdtype``."""
    return fmt(QDTYPES[qdtype]).max


def read_floor(value) -> str:
    """A scale_floor choice in its one spelling (module docstring): a name of ``SCALE_FLOORS``, or
    "amax:a" or "a" for a positive finite number a whose float32 rounding is positive, a written as
    Python's repr of float(a); ValueError saying what was expected otherwise."""
    if value in SCALE_FLOORS:
        return value
    text = str(value)
    prefix = "amax:" if text.startswith("amax:") else ""
    try:
        a = float(text[len(prefix):])
    except ValueError:
        a = math.nan
    if not (math.isfinite(a) and np.float32(a) > 0):
        raise ValueError(f"expected {' or '.join(SCALE_FLOORS)}, a positive number or amax:NUMBER (a number no "
                         f"smaller than float32's least subnormal), got {text!r}")
    return prefix + repr(a)


def floor(qdtype: str, scale_floor: str | None) -> float:
    """The scale's floor F under the declared ``scale_floor`` (``read_floor``; None: the default):
    MIN_SCALE / q, 2**-23, f32(a) / q ("amax:a") or f32(a) ("a")."""
    if scale_floor is None or scale_floor == "1/512q":
        return MIN_SCALE / qmax(qdtype)
    if scale_floor == "eps32":
        return EPS32
    rule = read_floor(scale_floor)
    a = float(np.float32(float(rule.removeprefix("amax:"))))
    return a / qmax(qdtype) if rule.startswith("amax:") else a


def scales(peak: np.ndarray, qdtype: str, scale_ub: float | None, scale_floor: str | None = None) -> np.ndarray:
    """scale = max(min(A, scale_ub) / q, F) per row from the rows' peaks A (float64), F = ``floor``."""
    q = qmax(qdtype)
    with np.errstate(all="ignore"):
        capped = peak if scale_ub is None else np.where(peak > scale_ub, scale_ub, peak)  # NaN stays NaN
        return np.where(np.isnan(capped), np.nan, np.maximum(capped / q, floor(qdtype, scale_floor)))


def peak(B, rows, nan: str | None):
    """max_i |rows_i| over the last dim (keepdim, float64) on backend B: NaN where a row holds one, or
    under ``nan == "ignore"`` over the non-NaN elements alone, 0 where there is none (``NAN_POLICIES``;
    |v| >= 0, so a NaN read as 0 is the max over the rest)."""
    if nan != "ignore":
        return B.row_peak(rows)
    a = B.to_float64(rows)
    return row_peak(np.where(np.isnan(a), 0.0, a))


def per_element(scale: np.ndarray, n: int, group: int | None = None) -> np.ndarray:
    """A scale per group of a row (shape (..., G)) repeated over its elements: (..., n).  Without
    ``group`` the groups are n / G long; with it, ``group`` long but the last, which takes what is
    left (G = ceil(n / group): a partial tail, ``TAILS``)."""
    scale = np.asarray(scale)
    if not scale.shape[-1]:
        return scale
    return np.repeat(scale, n // scale.shape[-1] if group is None else group, axis=-1)[..., :n]


def group_peaks(B, v, group: int, nan: str | None):
    """The amax of every group of ``group`` consecutive elements of v's rows (float64, (..., G),
    G = ceil(n / group)), the last group that of the n mod group elements left where it is partial;
    NaN policy ``nan`` (``peak``)."""
    n = v.shape[-1]
    whole = n // group * group
    peaks = peak(B, v[..., :whole].reshape(v.shape[:-1] + (n // group, group)), nan)[..., 0]
    if whole < n:  # the partial tail: its own amax, not one over a pad or the group before it
        peaks = np.concatenate([np.asarray(peaks, dtype=np.float64).reshape(v.shape[:-1] + (n // group,)),
                                np.asarray(peak(B, v[..., whole:], nan), dtype=np.float64)], axis=-1)
    return peaks


def rounded_scale(scale: np.ndarray, scale_format: str) -> np.ndarray:
    """The scale y was divided by: the oracle's scale, rounded up to a power of two for "ue8m0"."""
    return UE8M0.round(scale) if scale_format == "ue8m0" else np.asarray(scale)


def _over(B, v, divisor):
    """v / divisor on backend B, NaN wherever the divisor (a float64 scale) is infinite: a peak past
    float64's range, or an infinite v, leaves v / scale no value to round (the float64 path's inf / inf
    and the mpmath path's finite / inf would disagree), and such a group carries no claim
    (``bounds_quant``: past the compute format's range)."""
    divisor = np.broadcast_to(np.asarray(divisor, dtype=np.float64), np.shape(v))
    out = v / B.array(divisor)
    infinite = np.isinf(divisor)
    if infinite.any():
        out = out.copy()
        out[infinite] = B.array(np.nan)
    return out


def group_forward(base, qdtype: str, group: str, scale_format: str, layout: str, nan: str, scale_floor: str,
                  tail: str):
    """``base(B, **args)`` quantised per group of ``args[group]`` consecutive elements of a row
    (``rms_norm_group_quant``): (v / scale, scale before its rounding (per group, (..., G)), base's
    other outputs), with q = qdtype's largest value (qdtype: a fixed format name); the scales' memory
    layout (``args[layout]``) is the calling contract's, not the values'; the amax's NaN policy is
    ``args[nan]``'s (``peak``), the scale's floor ``args[scale_floor]``'s (``floor``), the tail rule
    ``args[tail]``'s (module docstring: G = n / group, or ceil(n / group) under "partial")."""

    def quantised(B, **args):
        rest = {k: v for k, v in args.items() if k not in (group, scale_format, layout, nan, scale_floor, tail)}
        first, *others = base(B, **rest)
        n, g = first.shape[-1], int(args[group])
        if n % g and args.get(tail) != "partial":
            raise ValueError(f"{group} must be a divisor of the row length {n} (tail=none), got {g}")
        scale = scales(group_peaks(B, first, g, args[nan]), qdtype, None, args[scale_floor])  # ue8m0: before its rounding up
        divisor = per_element(rounded_scale(scale, args[scale_format]), n, g)
        return (_over(B, first, divisor), B.array(scale), *others)

    return quantised


def forward(base, qdtype: str, scale_ub: str, nan: str, scale_floor: str):
    """The dynamically quantised forward from base's, ``base(B, **args) -> outputs``:
    (v / scale, scale, base's other outputs); the amax's NaN policy is ``args[nan]``'s (``peak``), the
    scale's floor ``args[scale_floor]``'s (``floor``)."""

    def quantised(B, **args):
        rest = {k: v for k, v in args.items() if k not in (qdtype, scale_ub, nan, scale_floor)}
        first, *others = base(B, **rest)
        scale = scales(peak(B, first, args[nan])[..., 0], args[qdtype], args[scale_ub], args[scale_floor])
        return (_over(B, first, np.asarray(scale)[..., None]), B.array(scale), *others)

    return quantised
