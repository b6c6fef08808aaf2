"""Gated RMSNorm, as Mamba-2, Qwen3-Next's gated delta net, flash-linear-attention's
``FusedRMSNormGated`` and vLLM's ``RMSNormGated`` compute it.

Per row (last dim, length n), with weight w, gate z (x's shape) and s = silu(z) = z sigma(z)
(``swiglu``: its IEEE limits, silu(-inf) = NaN):

    norm_before_gate:       y = rms_norm(x, w, eps) * s  = x_i rho w_i s_i,   rho = 1 / sqrt(mean(x^2) + eps)
    not norm_before_gate:   y = rms_norm(x * s, w, eps)  = g_i rho_g w_i,     g = x s, rho_g = 1 / sqrt(mean(g^2) + eps)

With groups (``group_size`` = G, a divisor of n; Mamba-2's ``RMSNormGated(group_size=G)``): the row is
n / G groups of G consecutive elements, J_j = {jG, ..., jG + G - 1}, and each is normalised on its own,

    rho_j = 1 / sqrt((1/G) sum_{k in J_j} q_k^2 + eps)   for i in J_j,   q = x (gate after) or x s (gate first)

that is, the op on a row is the ungrouped op on each group's columns, with that group's slice of w
and z: y[..., J_j] = rms_norm_gated(x[..., J_j], z[..., J_j], w[J_j]).  The VJP is the ungrouped one's
on each group alike: the means in dx are over the group, and dw[J_j] sums over the rows as before.
group_size None (the default) is the whole row, G = n.  ``by_groups`` evaluates exactly that
decomposition, so everything below is stated for one group and holds for any.

Vector-Jacobian product for cotangent dy (``rms_norm``'s VJP, ``rms_norm.vjp``, is (dx, dw) of
rms_norm at the rows it normalises):

    norm_before_gate:       (dx, dw) = rms_norm's VJP at x for the cotangent dy s
                            dz = dy (x rho w) silu'(z)
    not norm_before_gate:   (dg, dw) = rms_norm's VJP at g for the cotangent dy
                            dx = dg s,   dz = dg x silu'(z)

silu'(z) = sigma(z) (1 + z (1 - sigma(z))).  s and s' are formed with the products they enter
(``silu_times``, ``dsilu_times``: e**z scaled, so a gate at -1000 beside x = 1e300 is not lost to
float64's underflow).  Where x s overflows float64 (x and z near its largest value), the rows are
scaled first (``_gated_rows``: rms_norm is scale invariant); where dy s may, the cotangent is
(``_shrink``: the VJP is linear in it).  The float64 path forms each product once per element
(``pointwise(..., scaled=True)``: only a non-finite input or result is redone exactly); its own
error is a few u_64 of s, which ``bounds_gated_norm`` adds to the model's ORACLE.
"""
from __future__ import annotations

import numpy as np

from . import rms_norm


SHRINK = 2.0 ** -1030  # |x silu(z)| < 2**2048: scaled by it, below 2**1018 (a subnormal power of two: exact)


def silu_times(B, z, *factors):
    """silu(z) times the factors, elementwise: e**t z / (1 + e**-|z|) with t = min(z, 0), the product
    of e**t, z and the factors formed by ``B.exp_times``: nothing under- or overflows before the
    result (float64's e**-1000 is 0, but e**-1000 times x = 1e300 is 1e-134); only 1 + e**-|z|, in
    [1, 2], divides it.  At +-inf the IEEE values of the formula: silu(+inf) = +inf, silu(-inf) = NaN."""
    t = np.where(z < 0, z, 0.0)
    return B.exp_times(t, z, *factors) / (1 + B.exp(-abs(z)))


def dsilu_times(B, z, *factors):
    """silu'(z) = sigma(z) (1 + z (1 - sigma(z))) times the factors, elementwise: with a = e**-|z| it
    is e**t (1 + a + z) / (1 + a)**2 for z < 0 (t = z) and (1 + a + z a) / (1 + a)**2 for z >= 0
    (t = 0), the products formed as ``silu_times``'s; NaN at +-inf, as the formula's IEEE value."""
    a = B.exp(-abs(z))
    t = np.where(z < 0, z, 0.0)
    return B.exp_times(t, np.where(z < 0, 1 + a + z, 1 + a + z * a), *factors) / ((1 + a) * (1 + a))


def _gated_rows(B, x, z, eps):
    """(g, eps', c): g = c x silu(z) rounded once per element and eps' = c^2 eps, where c = 1, or
    SHRINK on a row where x silu(z) overflows float64 though x and z are finite.  rms_norm is scale
    invariant, rms_norm(c g, c^2 eps) = rms_norm(g, eps), and its gradient with respect to g is c
    times the one at c g.  (c^2 eps underflows to 0; on such a row mean(g^2) > 2**2048 / n, so eps
    changed rho by less than 2**-2000 relative.)"""
    g = B.pointwise(lambda B, a, b: silu_times(B, b, a), x, z, scaled=True)
    g64, x64, z64 = B.to_float64(g), B.to_float64(x), B.to_float64(z)
    over = (np.isinf(g64) & np.isfinite(x64) & np.isfinite(z64)).any(axis=-1, keepdims=True)
    if not over.any():
        return g, eps, 1.0
    c = np.where(over, SHRINK, 1.0)
    return B.pointwise(lambda B, a, b, k: silu_times(B, b, a, k), x, z, c, scaled=True), eps * c * c, c


def group_columns(n: int, group_size: int | None) -> list[slice] | None:
    """The column slices of a row's groups, or None where there is one group (the whole row)."""
    if group_size is None or int(group_size) == n or n == 0:
        return None
    size = int(group_size)  # the oracle's scalars come as floats (``kinds.Kind.convert``)
    return [slice(j, j + size) for j in range(0, n, size)]


def by_groups(fn, B, x, z, weight, *rest, group_size=None, cot=None):
    """fn on each group's columns (x, z and the cotangent sliced along the last dim, the weight
    alike), its outputs joined again along the last dim: a tuple of arrays (forward) or a dict of
    gradients (VJP).  One group: fn as it is."""
    cols = group_columns(x.shape[-1], group_size)
    if cols is None:
        return fn(B, x, z, weight, *rest) if cot is None else fn(B, cot, x, z, weight, *rest)
    part = lambda a, c: np.ascontiguousarray(a[..., c])  # noqa: E731
    outs = [fn(B, part(x, c), part(z, c), part(weight, c), *rest) if cot is None else
            fn(B, tuple(part(d, c) for d in cot), part(x, c), part(z, c), part(weight, c), *rest) for c in cols]
    if cot is None:
        return tuple(np.concatenate([o[i] for o in outs], axis=-1) for i in range(len(outs[0])))
    return {k: np.concatenate([o[k] for o in outs], axis=-1) for k in outs[0]}


def forward(B, x, z, weight, eps, norm_before_gate, group_size=None):
    return by_groups(_forward, B, x, z, weight, eps, norm_before_gate, group_size=group_size)


def vjp(B, cot, x, z, weight, eps, norm_before_gate, group_size=None):
    return by_groups(_vjp, B, x, z, weight, eps, norm_before_gate, group_size=group_size, cot=cot)


def _forward(B, x, z, weight, eps, norm_before_gate):
    if norm_before_gate:
        (r,) = rms_norm.forward(B, x, weight, eps)
        return (B.pointwise(lambda B, a, b: silu_times(B, b, a), r, z, scaled=True),)
    g, eps_g, _ = _gated_rows(B, x, z, eps)
    return rms_norm.forward(B, g, weight, eps_g)


def _shrink(B, dy):
    """k = 2**-e, the power of two that brings every |dy| below 1/2 (1 where they are): then
    |k dy s| < 2**1023 never overflows, and rms_norm's VJP, linear in its cotangent, is 1/k times
    the one for k dy s."""
    peak = float(np.max(np.abs(B.to_float64(dy)), initial=0.0))
    return 2.0 ** -(int(np.frexp(peak)[1]) + 1) if np.isfinite(peak) and peak >= 0.5 else 1.0


def _vjp(B, cot, x, z, weight, eps, norm_before_gate):
    (dy,) = cot
    if norm_before_gate:
        k = _shrink(B, dy)
        gated = B.pointwise(lambda B, d, b: silu_times(B, b, d, k), dy, z, scaled=True)  # k dy s
        grads = rms_norm.vjp(B, (gated,), x, weight, eps)
        (r,) = rms_norm.forward(B, x, weight, eps)
        dz = B.pointwise(lambda B, d, a, b: dsilu_times(B, b, d, a), dy, r, z, scaled=True)
        return {"x": grads["x"] / k, "z": dz, "weight": grads["weight"] / k}
    g, eps_g, c = _gated_rows(B, x, z, eps)
    grads = rms_norm.vjp(B, (dy,), g, weight, eps_g)
    dg = grads["x"]  # the gradient at c g: c dg is the one at g, formed last in each product (no underflow)
    return {"x": B.pointwise(lambda B, d, b, k: silu_times(B, b, d, k), dg, z, c, scaled=True),
            "z": B.pointwise(lambda B, d, a, b, k: dsilu_times(B, b, d, a, k), dg, x, z, c, scaled=True),
            "weight": grads["weight"]}
