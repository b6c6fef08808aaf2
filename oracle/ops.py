"""The ops normcert knows: one ``Op`` record each (see ``record``).

The call conventions are the contract in the README: out-of-place, tensors
positional in the order below, eps last; rms_norm's weight and layer_norm's
weight and bias may be None (ones, zeros); batch_norm takes ``mask=`` by keyword;
deep_norm takes its sublayer as a callable (the suite's affine one); GELU's form
(``approximate``, "none" or "tanh") is the last argument of geglu and gelu_and_mul;
the FP8 ops take the static scale last, after eps, and return float8_e4m3fn.

Derived forms take their bounds (and, on halves, their oracle) from their base op's by factory
(``bounds_derived``, ``halves``): add_rms_norm is rms_norm fused with the residual add,
silu_and_mul and gelu_and_mul are swiglu and geglu on the two halves of x, the FP8 ops are
rms_norm and add_rms_norm quantised.  The argument names a factory needs come from the records.
"""
from __future__ import annotations

import torch

from . import (batch_norm, bounds_derived, bounds_gated, bounds_norms, deep_norm, geglu, gemma_rms_norm, halves,
               layer_norm, rms_norm, rms_norm_fp8, swiglu)
from .record import Arg, Op, Out

X, RESIDUAL, WEIGHT, BIAS, EPS = Arg("x", "rows"), Arg("residual", "rows"), Arg("weight", "weight"), \
    Arg("bias", "bias"), Arg("eps", "eps")
GATE, UP = Arg("gate", "rows"), Arg("up", "rows")
APPROXIMATE = Arg("approximate", "approximate")
SCALE = Arg("scale", "scale")
Y, RESIDUAL_OUT = Out("y"), Out("residual_out", rounded=True)  # residual_out = x + residual, rounded once
Y_FP8 = Out("y", dtype=torch.float8_e4m3fn, quantised=True)
WEIGHTLESS_WEIGHT, WEIGHTLESS_BIAS = Arg("weight", "weight", optional=True), Arg("bias", "bias", optional=True)


def _on_halves(name: str, base: Op, args: tuple[Arg, ...], call) -> Op:
    """base on the two halves of args[0], the main tensor: its last dim is [first | second] of
    base's row inputs (``record.Op.halves``); oracle and bounds derived from base's."""
    main, parts = args[0].name, base.row_inputs
    oracle, bound = (lambda f: halves.oracle(f, main, parts)), (lambda f: bounds_derived.halves(f, main, parts))
    return Op(name, args, base.outs, (main,), oracle(base.forward), oracle(base.vjp),
              bound(base.forward_bound), bound(base.grad_bound), call=call,
              rowwise=base.rowwise, halves=True, indeterminate=bound(base.indeterminate))


RMS_NORM = Op("rms_norm", (X, WEIGHTLESS_WEIGHT, EPS), (Y,), ("x", "weight"),
              rms_norm.forward, rms_norm.vjp, bounds_norms.rms_norm_fwd, bounds_norms.rms_norm_bwd,
              call=lambda fn, a: fn(a["x"], a["weight"], a["eps"]),
              rowwise=True, scale_invariant=True, headwise=True)
ADD_RMS_NORM = Op("add_rms_norm", (X, RESIDUAL, WEIGHT, EPS), (Y, RESIDUAL_OUT), ("x", "residual", "weight"),
                  rms_norm.add_forward, rms_norm.add_vjp,
                  bounds_derived.fused_forward(RMS_NORM.forward_bound, X.name, RESIDUAL.name),
                  bounds_derived.fused_grad(RMS_NORM.grad_bound, X.name, RESIDUAL.name),
                  call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"]),
                  rowwise=True, scale_invariant=True, unfused=RMS_NORM.name)
SWIGLU = Op("swiglu", (GATE, UP), (Y,), ("gate", "up"),
            swiglu.forward, swiglu.vjp, bounds_gated.swiglu_fwd, bounds_gated.swiglu_bwd,
            call=lambda fn, a: fn(a["gate"], a["up"]),
            rowwise=True, indeterminate=bounds_gated.swiglu_indeterminate)
GEGLU = Op("geglu", (GATE, UP, APPROXIMATE), (Y,), ("gate", "up"),
           geglu.forward, geglu.vjp, bounds_gated.geglu_fwd, bounds_gated.geglu_bwd,
           call=lambda fn, a: fn(a["gate"], a["up"], a["approximate"]),
           rowwise=True, indeterminate=bounds_gated.geglu_indeterminate)

OPS: dict[str, Op] = {
    op.name: op
    for op in [
        RMS_NORM,
        Op("gemma_rms_norm", (X, WEIGHT, EPS), (Y,), ("x", "weight"),
           gemma_rms_norm.forward, gemma_rms_norm.vjp, bounds_norms.gemma_rms_norm_fwd,
           bounds_norms.gemma_rms_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["eps"]),
           rowwise=True, scale_invariant=True, headwise=True),
        ADD_RMS_NORM,
        Op("rms_norm_fp8", (X, WEIGHT, EPS, SCALE), (Y_FP8,), (),
           rms_norm_fp8.forward, None, bounds_derived.quantised(RMS_NORM.forward_bound, X.name, SCALE.name), None,
           call=lambda fn, a: fn(a["x"], a["weight"], a["eps"], a["scale"]),
           rowwise=True, scale_invariant=True),
        Op("add_rms_norm_fp8", (X, RESIDUAL, WEIGHT, EPS, SCALE), (Y_FP8, RESIDUAL_OUT), (),
           rms_norm_fp8.add_forward, None, bounds_derived.quantised(ADD_RMS_NORM.forward_bound, X.name, SCALE.name),
           None,
           call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"], a["scale"]),
           rowwise=True, scale_invariant=True, unfused="rms_norm_fp8"),
        Op("layer_norm", (X, WEIGHTLESS_WEIGHT, WEIGHTLESS_BIAS, EPS), (Y,), ("x", "weight", "bias"),
           layer_norm.forward, layer_norm.vjp, bounds_norms.layer_norm_fwd, bounds_norms.layer_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["bias"], a["eps"]),
           rowwise=True, scale_invariant=True, shift_invariant=True, headwise=True),
        Op("batch_norm", (X, WEIGHT, BIAS, Arg("mask", "mask"), EPS), (Y,), ("x", "weight", "bias"),
           batch_norm.forward, batch_norm.vjp, bounds_norms.batch_norm_fwd, bounds_norms.batch_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["bias"], a["eps"], mask=a["mask"]),
           rowwise=False, scale_invariant=True, shift_invariant=True),
        Op("deep_norm", (X, Arg("sub_weight", "matrix"), Arg("sub_bias", "vector"), WEIGHT, BIAS,
                         Arg("alpha", "alpha"), EPS), (Y,), ("x", "weight", "bias"),
           deep_norm.forward, deep_norm.vjp, bounds_norms.deep_norm_fwd, bounds_norms.deep_norm_bwd,
           call=lambda fn, a: fn(a["x"], deep_norm.affine_sublayer(a["sub_weight"], a["sub_bias"]), a["alpha"],
                                 a["weight"], a["bias"], a["eps"]),
           rowwise=True, max_width=128, max_rank=3),
        SWIGLU,
        _on_halves("silu_and_mul", SWIGLU, (X,), call=lambda fn, a: fn(a["x"])),
        GEGLU,
        _on_halves("gelu_and_mul", GEGLU, (X, APPROXIMATE), call=lambda fn, a: fn(a["x"], a["approximate"])),
    ]
}
