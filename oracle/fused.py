"""An op fused with the residual add, from the op it fuses (``record.Op.unfused``).

For a base op f(x, rest) that normalises the rows of x, with residual r:

    s              = x + r                         (the exact sum)
    op(x, r, rest) = (f(s, rest), res),  res = RNE(s)   (s rounded once, to res's dtype)

Vector-Jacobian product for cotangents (dy, dres):

    dx = dr = (d f / d s)^T dy + dres,   the rest's gradients are f's at s.

Where x + r overflows float64 (both near float64's largest value) the backend gives
s = c (x + r) with c = 1/2 on those rows (``backends``' ``scaled_sum``), and f is
evaluated at (c (x + r), c^2 eps): f's scale invariance (``record.Op.scale_invariant``:
f(c x, c^2 eps) = f(x, eps)) makes that the same value, res is s / c, and the gradient
with respect to x + r is c times f's at (c (x + r), c^2 eps).

The rounding of res (to its ``record.Out`` dtype) is the oracle's caller's
(``oracle.forward`` rounds every ``Out.rounded`` output); here res is s, exact.
"""
from __future__ import annotations


def _summed(B, args: dict, main: str, residual: str, eps: str):
    """(the base op's arguments at s, c): x and r replaced by s = c (x + r), eps by c^2 eps."""
    rest = {k: v for k, v in args.items() if k not in (main, residual)}
    s, c = B.scaled_sum(args[main], args[residual])
    rest[eps] = rest[eps] * c * c
    return {main: s, **rest}, c


def forward(base, main: str, residual: str, eps: str):
    """The fused forward from base's, ``base(B, **args) -> outputs``: base's outputs at s, then res."""

    def fused(B, **args):
        at_s, c = _summed(B, args, main, residual, eps)
        return (*base(B, **at_s), at_s[main] / c)

    return fused


def vjp(base, main: str, residual: str, eps: str):
    """The fused VJP from base's, ``base(B, cotangents, **args) -> {input: gradient}``."""

    def fused(B, cot, **args):
        *dy, dres = cot
        at_s, c = _summed(B, args, main, residual, eps)
        grads = base(B, tuple(dy), **at_s)
        grads[main] = c * grads[main] + dres
        grads[residual] = grads[main]
        return grads

    return fused
