r"""Error-model bounds of the derived forms, from the base op's bounds (wired in ``ops``).

Fused with the residual add (``fused_forward``, ``fused_grad``): op(x, r, ...) =
(base(s, ...), residual_out = RNE(s)), s = x + r (``record.Op.unfused``).

    y             base's bound at s, plus 2 u_s |y_i| (the sum may be rounded to residual_out's
                  dtype, the residual stream's, before normalising: u_s is its unit roundoff, u_o
                  when the stream is in x's dtype); rows where that rounding overflows though x and r are finite carry
                  no claim (a kernel may normalise the rounded sum, the residual stream it stores,
                  and then gets inf where the exact y is finite)
    residual_out  0: bit-exact
    dx            base's dx at s, with s's rounding (u_s |s_i|) in its terms, and the residual_out
                  cotangent added before dx is rounded (``bounds_norms.rms_norm_bwd``)
    dr            the same value, the same terms; its final roundings (the cotangent's add in c, the
                  store) are those of r's dtype, not x's (``NormInput.stored``): a float32 stream's
                  gradient beside a bfloat16 x is bounded by 2 u_32 (|dx - dres| + |dres|), not by
                  2 u_bf16 of it.  A kernel that rounds it through x's dtype (flash-linear-attention's
                  layer_norm backward) errs by u_bf16 |dx|, which the bf16 bound (0.5 to 0.7 of it)
                  let through; in float16 the same cast overflows past 65504 and was caught already

On halves (``halves``): op(x) = base(x[..., :h], x[..., h:]) (``record.Op.halves``, ``oracle.halves``):
base's bounds on the two halves, its gradient bounds joined along the last dim.

Quantised (``quantised``), e.g. rms_norm_fp8 (and, fused, add_rms_norm_fp8): on v = base(x) / scale before the
kernel's last rounding (to float8_e4m3fn): base's bound (x.dtype's roundings included: a kernel may
round rms_norm(x) to x.dtype and then scale it, as vLLM's does) / scale, plus 3 u_c |v| (scale
rounded to c, and 1 / scale and a product, or a division).  The output must lie in
[RNE(v - B), RNE(v + B)] (``assessment.assess``, ``record.Op.quantised``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import halves as halves_form
from .bounds_norms import NormInput
from .error_model import Context
from .formats import fmt, to_float64


def sum_overflows(x, residual):
    """Rows where RNE(x + residual) overflows the residual stream's dtype though x and residual are
    finite (keepdims)."""
    xv, rv = to_float64(x), to_float64(residual)
    with np.errstate(all="ignore"):
        rounded = fmt(residual.dtype).round(xv + rv)
    return (np.isinf(rounded) & np.isfinite(xv) & np.isfinite(rv)).any(axis=-1, keepdims=True)


def _summed(args, main, residual, cotangent=0.0):
    """s = main + residual as the base bound's rows: rounded to the residual's dtype (residual_out's),
    claimed where RNE(s) is finite."""
    return NormInput(to_float64(args[main]) + to_float64(args[residual]), rounded=args[residual].dtype,
                     claim=~sum_overflows(args[main], args[residual]), cotangent=cotangent)


def fused_forward(base, main: str, residual: str):
    """The forward bound of base fused with the residual add (module docstring): base's bounds, then
    residual_out's; base takes the rows it normalises as ``rows=`` (other keywords go to it)."""

    def bound(args, exact, kernel=True, **kw):
        return (*base(args, exact, kernel, rows=_summed(args, main, residual), **kw), np.zeros_like(exact[-1]))

    return bound


def fused_grad(base, main: str, residual: str):
    """The gradient bound of base fused with the residual add: cotangents (dy, dresidual_out);
    main and residual get the same gradient, and the same bound but for its final rounding, which is
    in the residual's dtype (module docstring): a float32 stream's is base's with ``stored`` float32."""

    def bound(args, cot, exact):
        rows = _summed(args, main, residual, cotangent=to_float64(cot[1]))
        grads = base(args, cot, exact, rows=rows)
        stream = args[residual].dtype
        if stream == args[main].dtype:
            grads[residual] = grads[main]
        else:
            grads[residual] = base(args, cot, exact, rows=replace(rows, stored=stream))[main]
        return grads

    return bound


def halves(base, main: str, parts: tuple[str, str]):
    """base (a forward bound, gradient bound or ``indeterminate``) for the halves form: every
    by-name dict it is given (the arguments; the exact gradients) has ``main`` split into
    ``parts``, and a gradient bound's result is joined back into ``main``."""

    def on_halves(args, *rest, **kw):
        rest = tuple(halves_form.split(r, main, parts) if isinstance(r, dict) else r for r in rest)
        out = base(halves_form.split(args, main, parts), *rest, **kw)
        return halves_form.join(out, main, parts) if isinstance(out, dict) else out

    return on_halves


def quantised(base, main: str, scale: str):
    """The bound on v = y / scale (the first output, before its rounding to fp8) from base's bound
    on y = v scale: divided by scale, plus 3 u_c |v|; the other outputs' bounds as base gives them.
    Keywords (a fused form's ``rows=``) go to base."""

    def bound(args, exact, kernel=True, **kw):
        ctx = Context(args[main].dtype, kernel=kernel)
        v, s = exact[0], args[scale]
        with np.errstate(all="ignore"):
            y_bound, *rest = base(args, (v * s, *exact[1:]), kernel, **kw)
            return (y_bound / s + 3 * ctx.uc * np.abs(v), *rest)

    return bound
