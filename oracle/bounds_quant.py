r"""Error-model bounds of the dynamically quantised forms (``dynamic_quant``), from the base op's.

Notation and the reference kernel as in ``error_model``; v is the base op's first output and B_v
its bound (x.dtype's roundings included: vLLM rounds x rho to x.dtype, then its product with the
weight), q the quantised format's largest value, S the exact scale of a row, s_k the kernel's.

    scale   the kernel takes A_k = max_i |v_k,i| of its own v, within max_i B_v,i of A = max_i |v_i|
            (|max|a| - max|b|| <= max|a - b|); the cap at scale_ub and the floor are 1-Lipschitz and
            exact (under nan=ignore the max is over the elements whose exact v is not NaN: there the
            kernel's v is NaN too, the base op's NaN policy, so its maximumNumber drops the same ones,
            and the same inequality holds over the rest); the division by q (or a product with a rounded 1 / q) costs 2 u_c S, the float32
            store u_32 S, and the float64 oracle's own division ORACLE S:

                B_s = |s_k - S| <= max_i B_v,i / q + (2 u_c + u_32 + ORACLE) S

    y       against the kernel's own scale (``kernel_scale``, the accuracy check): w = v / s_k, and
            the kernel's value before its last rounding is within B_v / s_k + 2 u_c |w| of it (a
            division, or a rounded reciprocal and a product), plus ORACLE |w| (w formed in float64).
            y must lie in [Q(w - B), Q(w + B)] (``assessment.assess``): bit-exact where B reaches no
            midpoint.  Against the exact scale (two calls of a kernel compared): any scale within
            B_s of S, so B_v / (S - B_s) + 2 u_c |w| + |v| B_s / (S (S - B_s)) around w = v / S.
            No claim (bound -inf) where the scale is not a positive finite number (its own check
            says so, or its row has no claim) or, for int8, which has no NaN, where v is NaN.

Per group (``per_group``) the same with a group for the row: A, S, B_s and the y bound are each
group's, the max over its own elements.  Under tail=partial (``dynamic_quant``) the last group of a
row may hold m < group elements; no term above depends on a group's size (the peak inequality
|max|a| - max|b|| <= max|a - b| holds over any set, the division by q and the stores cost the same
relative error per scale, and y's bound is per element), so the partial group's bound is the same
formula taken over its m elements: max over them of B_v,i / q + (2 u_c + u_32 + ORACLE) S.  B_v,i
itself is the base op's, of the whole row (a norm's statistics are over the row, not the group).

FP4 (``block``, ``fp4``): per block, S = A / (6 g) with g the global scale.  The kernel's amax is
within max_block B_v of A as above; it divides by 6 and by g, or multiplies by reciprocals of
them (``rcp.approx``): each of the two divisions is a reciprocal good to FN_ULPS ulps of c (at most
2 FN_ULPS u_c relative, ``error_model``) and a rounded product (u_c), so

    B_s = max_block B_v / (6 g) + (gam(2 (2 FN_ULPS + 1)) + ORACLE) S + lam_c

(lam_c: a result flushed to zero), on S before the rounding R of its format (E4M3 or UE8M0), which
the kernel's stored scale is checked to the step: s_k in [R(S - B_s), R(S + B_s)].  y against the
kernel's own scale: w = v / (s_k g), formed by the same two divisions (or s_k g rounded and one
division), so B_y = B_v / (s_k g) + (gam(2 (2 FN_ULPS + 1)) + ORACLE) |w| + lam_c, and y must be
E2M1(w) to the step; where s_k = 0 (an E4M3 scale that underflowed) y is 0, exactly (bound 0).  No
claim where s_k is NaN or inf, where v is NaN (E2M1 has no NaN), or where s_k g overflows the
compute format (a UE8M0 scale of 2**127 saturated from an infinite v, times g > 1: the divisor is
not representable, as a row whose mean square overflows is outside the contract, ``error_model``).

Where the kernel holds v before its amax is a contract choice (argument kind "intermediate",
``fp4.INTERMEDIATES``): "float32" (the default, a fused kernel) holds it in c, float32 (float64 for
float64 inputs); "input" (an unfused pipeline: silu_and_mul, then the quant) materialises it in x's
dtype o first.  Let M be the largest value of that format: c's, or min(c, o)'s.  A block with an
element whose exact v is finite but reaches M within its bound (|v| + B_v >= M) has no claim: the
kernel's v there may be finite or infinite, and the block's scale with it.  Under "float32" a
float16 v past 65504 is therefore claimed (c holds it; a kernel that rounds it to float16 makes it
inf and is wrong), under "input" its block is not.  An element whose exact v is infinite (an
infinite input: silu(g) u with u = inf) is claimed, with B_v = 0: every correct kernel holds that
infinity (or a NaN where ``indeterminate``), so its block's peak is inf, its scale S = inf, stored
as R(inf) (E4M3's 448, UE8M0's 2**127, the rules' clamps), and its own y is E2M1(+-inf) = +-6,
bound 0; the block's other elements keep their bounds against that scale.  For float64 inputs an
infinite oracle v may stand for a finite exact value past float64's range, whose kernel value may
round to the largest finite one: no claim there, as a finite v reaching M.  Against the exact scale (two
calls compared): any s in [R(S - B_s), R(S + B_s)], as for the group quant, with D (``fp4.divisor``)
for S_P; none where that range reaches 0.
"""
from __future__ import annotations

import numpy as np
import torch

from .dynamic_quant import QDTYPES, per_element, qmax, rounded_scale
from .formats import UE8M0
from .error_model import FN_ULPS, ORACLE, Context
from .formats import FORMATS, IntegerFormat, compute_format, fmt
from .lattice import normal_or_zero, power_of_two
from .fp4 import BLOCK_FORMATS, divisor, rounding

U_32 = FORMATS[torch.float32].u  # the scales are stored in float32


def spread(scale, like, group: int | None = None) -> np.ndarray:
    """A scale per row (shape like.shape[:-1]) or per group of a row (like.shape[:-1] + (G,)) as one
    value per element of ``like`` (groups of ``group`` elements, the last partial, where given:
    ``dynamic_quant.per_element``)."""
    scale = np.asarray(scale, dtype=np.float64)
    return per_element(scale, np.shape(like)[-1], group) if scale.ndim == np.ndim(like) else scale[..., None]


def by_group(a, group: int, fill) -> np.ndarray:
    """a's rows (..., n) as (..., G, group), G = ceil(n / group): a partial last group padded with
    ``fill`` (0 for a max of errors, False for an any)."""
    a = np.asarray(a)
    n = a.shape[-1]
    pad = -n % group
    if pad:
        a = np.concatenate([a, np.full(a.shape[:-1] + (pad,), fill, dtype=a.dtype)], axis=-1)
    return a.reshape(a.shape[:-1] + ((n + pad) // group, group))


def rescaled(y, scale, kernel_scale, group: int | None = None):
    """w = v / s_k from the oracle's y = v / S and S (the scale y was divided by, rounded where its
    format rounds): the exact value over the kernel's own scale (per group of ``group``: ``spread``)."""
    with np.errstate(all="ignore"):
        ks = spread(kernel_scale, y, group)
        return np.where(ks == 0, 0.0, y * spread(scale, y, group) / ks)  # a zero scale gives y = 0 (``fp4``)


def dynamic(base, main: str, qdtype: str, nan: str, indeterminate=None):
    """The bounds (y's, the scale's, the rest) of base dynamically quantised per row to
    ``args[qdtype]``: ``quantised`` with one group per row, a float32 scale."""
    return quantised(base, main, lambda args: args[qdtype], None, lambda args: "float32", nan, indeterminate)


def per_group(base, main: str, qdtype: str, group: str, scale_format: str, nan: str, indeterminate=None):
    """The bounds of base quantised per group of ``args[group]`` elements of a row to ``qdtype``
    (a fixed format name), its scales stored as ``args[scale_format]`` says
    (``dynamic_quant.group_forward``): ``quantised``."""
    return quantised(base, main, lambda args: qdtype, lambda args: int(args[group]), lambda args: args[scale_format],
                     nan, indeterminate)


def peak_errors(v_err, v, args: dict, nan: str):
    """The elements' errors a peak is taken of: all of them, or under ``args[nan] == "ignore"`` those
    whose exact v is not NaN (a NaN element's error read as 0: the max drops it, module docstring)."""
    return np.where(np.isnan(v), 0.0, v_err) if args.get(nan) == "ignore" else v_err


def unclaimed_nan(v, args: dict, nan: str) -> np.ndarray:
    """Where an element's exact v is NaN under ``args[nan] == "unspecified"`` (``dynamic_quant``: its
    row, group or block then carries no claim), else nowhere."""
    return np.isnan(v) if args.get(nan) == "unspecified" else np.zeros(np.shape(v), bool)


def quantised(base, main: str, qdtype_of, group_of, format_of, nan: str, indeterminate=None):
    """The bounds (y's, the scale's, the rest) of base quantised to the format ``qdtype_of(args)``
    names, one scale per group of ``group_of(args)`` elements of a row (or one per row, where the
    oracle's scale has one value per row; group_of is then None), the peak's NaN policy ``args[nan]``
    (``peak_errors``), y's against the exact scale or,
    given ``kernel_scale``, against that; other keywords (a fused form's ``rows=``) go to base.

    The scale's bound B_s is on its value before any rounding (the oracle's): max over the group of
    B_v / q + (2 u_c + u_32 + ORACLE) S (module docstring).  Where ``format_of(args)`` is "ue8m0" the
    kernel's scale is that value rounded up to a power of two (checked to the step), so the scales
    a correct kernel may divide by lie in [P(S - B_s), P(S + B_s)] (P: UE8M0's rounding; the
    identity for float32), and against the exact scale y's bound allows any of them:
    B_v / s_lo + (2 u_c + ORACLE) |w| + |v| max(1 / s_lo - 1 / S_P, 1 / S_P - 1 / s_hi), S_P = P(S)
    (for float32, |v| B_s / (S (S - B_s))).

    ``indeterminate`` (base's, ``record.Op.indeterminate``; silu_and_mul's): the elements of v whose
    exact value is infinite but which a correct kernel may compute as NaN (silu(g) flushed to 0 times
    an infinite up).  The amax of a group holding one is then NaN or inf at the kernel's choice, and
    so is its scale, and every y of the group is divided by it: the scale and the group's y carry no
    claim there (bound -inf), the rule the base op's own NaN-for-inf allowance implies once a max is
    taken over it.

    A group whose v, within its bound, reaches past the largest value of the compute format or of
    x's dtype (|v| + B_v >= min(c_max, o_max): silu(g) u of two huge halves, whose product overflows
    float32, or float16's 65504, though its scale A / q would not) carries no claim either, scale and
    y: the reference kernel holds v in c, and may round it to x's dtype (``error_model``: ROUNDINGS;
    SGLang's silu_and_mul quant rounds silu(g) and the product to it), before it takes the peak --
    the "Domain" rule of a row whose mean square c cannot hold.  A norm's v gets there only through
    its weight (|v| <= sqrt(n) |w|)."""

    def bound(args, exact, kernel=True, kernel_scale=None, **kw):
        ctx = Context(args[main].dtype, kernel=kernel)
        y, scale, form, name = exact[0], exact[1], format_of(args), qdtype_of(args)
        per_row = np.ndim(scale) < np.ndim(y)  # one scale per row (an empty row's: no group to split)
        g = None if per_row else group_of(args)

        def wide(a):  # a value per group (or row) as one per element: a partial last group's too
            return spread(a, y, g)

        with np.errstate(all="ignore"):
            used = rounded_scale(scale, form)
            v = y * wide(used)
            v_bound, *rest = base(args, (v, *exact[2:]), kernel, **kw)
            v_err = np.where(np.isnan(v_bound), np.inf, v_bound)
            at_peak = peak_errors(v_err, v, args, nan)
            if per_row:
                peak_err = np.max(at_peak, axis=-1, initial=0.0)
            else:  # a partial group's peak over its own elements (the pad's 0 is no error)
                peak_err = np.max(by_group(at_peak, g, 0.0), axis=-1, initial=0.0)
            scale_bound = peak_err / qmax(name) + (2 * ctx.uc + (U_32 if kernel else 0.0) + ORACLE) * scale
            if kernel_scale is None:
                lo, hi = np.where(scale > scale_bound, scale - scale_bound, 0.0), scale + scale_bound
                if form == "ue8m0":
                    lo, hi = UE8M0.round(lo), UE8M0.round(hi)
                s, s_lo, s_hi = wide(used), wide(lo), wide(hi)
                y_bound = (v_bound / s_lo + (2 * ctx.uc + ORACLE) * np.abs(v / s)
                           + np.abs(v) * np.maximum(1 / s_lo - 1 / s, 1 / s - 1 / s_hi))
            else:
                s = wide(kernel_scale)
                y_bound = v_bound / s + (2 * ctx.uc + ORACLE) * np.abs(v / s)
            no_claim = ~(np.isfinite(s) & (s > 0))
            if isinstance(fmt(QDTYPES[name]), IntegerFormat):  # int8 has no NaN to give
                no_claim = no_claim | np.isnan(v)
            y_bound = np.where(no_claim, -np.inf, np.where(np.isnan(y_bound), np.inf, y_bound))

            def any_in_group(mask):
                return mask.any(axis=-1) if per_row else by_group(mask, g, False).any(axis=-1)

            reach = np.where(np.isinf(wide(used)), np.inf, np.abs(v) + v_err)  # an infinite scale: v is
            loose = reach >= min(ctx.cmax, ctx.omax)  # past c's or x.dtype's range (the docstring); NaN rows not
            if indeterminate is not None:
                loose = loose | np.asarray(indeterminate(args), dtype=bool)
            group_loose = any_in_group(loose | unclaimed_nan(v, args, nan))
            scale_bound = np.where(group_loose, -np.inf, scale_bound)
            y_bound = np.where(wide(group_loose).astype(bool), -np.inf, y_bound)
        return (y_bound, scale_bound, *rest)

    return bound


def exactly_quantised(args, exact_rows, rows, v, w, s, d, g: float, c) -> np.ndarray:
    """The elements whose w = v / (s g) (the caller's) every correct kernel forms exactly under
    arithmetic=ieee (``lattice``): on a row ``exact_rows`` proves exact (its v, exact, equal to the oracle's ``v``), with
    the kernel's scale ``s``, the oracle's divisor ``d`` and ``g`` powers of two and v / s, v / g and
    w zero or normal numbers of the compute format (then 1 / s, 1 / g and the quotient are exact in
    any order, and the oracle's w = v / (s g) is exact in float64 too); c the compute format."""
    ok, lattice_v = exact_rows(args, rows)
    with np.errstate(all="ignore"):
        return (ok & (lattice_v == v) & power_of_two(s) & power_of_two(d) & bool(power_of_two(g))
                & normal_or_zero(v / s, c) & normal_or_zero(v / g, c) & normal_or_zero(w, c))


DIVISIONS = 2 * (2 * FN_ULPS + 1)  # two divisions, each a reciprocal good to FN_ULPS ulps and a product


def block(base, main: str, block_format: str, global_scale: str, nan: str, indeterminate=None, exact_rows=None):
    """The bounds (y's, the scale's, the rest) of base quantised to FP4 per block
    (``fp4.forward``): the module docstring's B_s and B_y, the peak's NaN policy ``args[nan]``, a block
    whose v may overflow where the kernel holds it (``args["intermediate"]``) without a claim, one whose
    exact v is infinite held to R(inf).  ``indeterminate``: base's (where an
    infinite exact v may come back NaN, ``bounds_gated``): a block holding such an element has no
    claim, on its scale (NaN's amax is NaN) or its values.  ``exact_rows``: base's rows that every correct
    order computes exactly (``bounds_norms.rms_norm_exact``), where under arithmetic=ieee y's bound against
    the kernel's own scale is 0 (``exactly_quantised``)."""

    def bound(args, exact, kernel=True, kernel_scale=None, **kw):
        ctx = Context(args[main].dtype, kernel=kernel)
        f, g = BLOCK_FORMATS[args[block_format]], float(args[global_scale])
        form = rounding(args, block_format)
        y, scale = exact[0], exact[1]
        n = y.shape[-1]
        rel = ctx.gam(DIVISIONS) + ORACLE
        with np.errstate(all="ignore"):
            d = divisor(scale, form)
            v = y * spread(d, y) * g
            v_bound, *rest = base(args, (v, *exact[2:]), kernel, **kw)
            infinite = np.isinf(v) & (args[main].dtype != torch.float64)  # exactly infinite (module docstring)
            v_err = np.where(infinite, 0.0, np.where(np.isnan(v_bound), np.inf, v_bound))
            v_err = peak_errors(v_err, v, args, nan)
            peak_err = np.max(v_err.reshape(v_bound.shape[:-1] + (n // f.block, f.block)), axis=-1, initial=0.0)
            scale_bound = np.where(np.isinf(scale), 0.0, peak_err / (6 * g) + rel * scale + ctx.lam_c)  # S = inf: R(inf)
            if kernel_scale is None:
                lo = form.round(np.where(scale > scale_bound, scale - scale_bound, 0.0))
                hi = form.round(scale + scale_bound)
                s, s_lo, s_hi = spread(d, y), spread(lo, y), spread(hi, y)
                y_bound = np.where(s_lo > 0, v_bound / (s_lo * g) + rel * np.abs(y) + ctx.lam_c
                                   + np.abs(v) / g * np.maximum(1 / s_lo - 1 / s, 1 / s - 1 / s_hi), np.inf)
                no_claim = np.isnan(s) | (s_hi * g > ctx.cmax)
            else:
                s = spread(kernel_scale, y)
                w = v / (s * g)
                y_bound = np.where(s == 0, 0.0, v_bound / (s * g) + rel * np.abs(w) + ctx.lam_c)
                if exact_rows is not None and args.get("arithmetic") == "ieee":
                    y_bound = np.where(exactly_quantised(args, exact_rows, kw.get("rows"), v, w, s, spread(d, y), g,
                                                                compute_format(args[main].dtype)), 0.0, y_bound)
                no_claim = ~np.isfinite(s) | (s < 0) | (s * g > ctx.cmax)
            y_bound = np.where(infinite, 0.0, y_bound)  # E2M1(+-inf / s g) = +-6 exactly
            no_claim = no_claim | np.isnan(v)
            held = min(ctx.cmax, ctx.omax) if args.get("intermediate") == "input" else ctx.cmax  # None: the default
            loose = unclaimed_nan(v, args, nan) | (~infinite & (np.abs(v) + v_err >= held))  # may overflow where held
            if indeterminate is not None:
                loose = loose | np.asarray(indeterminate(args), bool)
            if loose.any():
                loose = loose.reshape(v.shape[:-1] + (n // f.block, f.block)).any(-1)
                scale_bound = np.where(loose, -np.inf, scale_bound)
                no_claim = no_claim | np.repeat(loose, f.block, axis=-1)
            y_bound = np.where(no_claim, -np.inf, np.where(np.isnan(y_bound), np.inf, y_bound))
        return (y_bound, scale_bound, *rest)

    return bound
