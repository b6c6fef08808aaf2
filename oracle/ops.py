"""The ops normcert knows: one ``Op`` record each (see ``record``).

The call conventions are the contract in the README: out-of-place, tensors
positional in the order below, eps last; rms_norm's weight and layer_norm's
weight and bias may be None (ones, zeros); batch_norm takes ``mask=`` by keyword;
deep_norm takes its sublayer as a callable (the suite's affine one); GELU's form
(``approximate``, "none" or "tanh") is the last argument of geglu and gelu_and_mul;
the FP8 ops take the static scale last, after eps, and return float8_e4m3fn.
"""
from __future__ import annotations

import torch

from . import batch_norm, deep_norm, error_model, geglu, gemma_rms_norm, layer_norm, rms_norm, rms_norm_fp8, swiglu
from .record import Arg, Op, Out

X, RESIDUAL, WEIGHT, BIAS, EPS = Arg("x", "rows"), Arg("residual", "rows"), Arg("weight", "weight"), \
    Arg("bias", "bias"), Arg("eps", "eps")
APPROXIMATE = Arg("approximate", "approximate")
SCALE = Arg("scale", "scale")
Y, RESIDUAL_OUT = Out("y"), Out("residual_out", rounded=True)  # residual_out = x + residual, rounded once
Y_FP8 = Out("y", dtype=torch.float8_e4m3fn, quantised=True)
WEIGHTLESS_WEIGHT, WEIGHTLESS_BIAS = Arg("weight", "weight", optional=True), Arg("bias", "bias", optional=True)

OPS: dict[str, Op] = {
    op.name: op
    for op in [
        Op("rms_norm", (X, WEIGHTLESS_WEIGHT, EPS), (Y,), ("x", "weight"),
           rms_norm.forward, rms_norm.vjp, error_model.rms_norm_fwd, error_model.rms_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["eps"]),
           rowwise=True, scale_invariant=True, headwise=True),
        Op("gemma_rms_norm", (X, WEIGHT, EPS), (Y,), ("x", "weight"),
           gemma_rms_norm.forward, gemma_rms_norm.vjp, error_model.gemma_rms_norm_fwd, error_model.gemma_rms_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["eps"]),
           rowwise=True, scale_invariant=True, headwise=True),
        Op("add_rms_norm", (X, RESIDUAL, WEIGHT, EPS), (Y, RESIDUAL_OUT), ("x", "residual", "weight"),
           rms_norm.add_forward, rms_norm.add_vjp, error_model.add_rms_norm_fwd, error_model.rms_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"]),
           rowwise=True, scale_invariant=True, unfused="rms_norm"),
        Op("rms_norm_fp8", (X, WEIGHT, EPS, SCALE), (Y_FP8,), (),
           rms_norm_fp8.forward, None, error_model.rms_norm_fp8_fwd, None,
           call=lambda fn, a: fn(a["x"], a["weight"], a["eps"], a["scale"]),
           rowwise=True, scale_invariant=True),
        Op("add_rms_norm_fp8", (X, RESIDUAL, WEIGHT, EPS, SCALE), (Y_FP8, RESIDUAL_OUT), (),
           rms_norm_fp8.add_forward, None, error_model.add_rms_norm_fp8_fwd, None,
           call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"], a["scale"]),
           rowwise=True, scale_invariant=True, unfused="rms_norm_fp8"),
        Op("layer_norm", (X, WEIGHTLESS_WEIGHT, WEIGHTLESS_BIAS, EPS), (Y,), ("x", "weight", "bias"),
           layer_norm.forward, layer_norm.vjp, error_model.layer_norm_fwd, error_model.layer_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["bias"], a["eps"]),
           rowwise=True, scale_invariant=True, shift_invariant=True, headwise=True),
        Op("batch_norm", (X, WEIGHT, BIAS, Arg("mask", "mask"), EPS), (Y,), ("x", "weight", "bias"),
           batch_norm.forward, batch_norm.vjp, error_model.batch_norm_fwd, error_model.batch_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["bias"], a["eps"], mask=a["mask"]),
           rowwise=False, scale_invariant=True, shift_invariant=True),
        Op("deep_norm", (X, Arg("sub_weight", "matrix"), Arg("sub_bias", "vector"), WEIGHT, BIAS,
                         Arg("alpha", "alpha"), EPS), (Y,), ("x", "weight", "bias"),
           deep_norm.forward, deep_norm.vjp, error_model.deep_norm_fwd, error_model.deep_norm_bwd,
           call=lambda fn, a: fn(a["x"], deep_norm.affine_sublayer(a["sub_weight"], a["sub_bias"]), a["alpha"],
                                 a["weight"], a["bias"], a["eps"]),
           rowwise=True, max_width=128, max_rank=3),
        Op("swiglu", (Arg("gate", "rows"), Arg("up", "rows")), (Y,), ("gate", "up"),
           swiglu.forward, swiglu.vjp, error_model.swiglu_fwd, error_model.swiglu_bwd,
           call=lambda fn, a: fn(a["gate"], a["up"]),
           rowwise=True, indeterminate=error_model.swiglu_indeterminate),
        Op("silu_and_mul", (X,), (Y,), ("x",),
           swiglu.mul_forward, swiglu.mul_vjp, error_model.silu_and_mul_fwd, error_model.silu_and_mul_bwd,
           call=lambda fn, a: fn(a["x"]),
           rowwise=True, halves=True, indeterminate=error_model.silu_and_mul_indeterminate),
        Op("geglu", (Arg("gate", "rows"), Arg("up", "rows"), APPROXIMATE), (Y,), ("gate", "up"),
           geglu.forward, geglu.vjp, error_model.geglu_fwd, error_model.geglu_bwd,
           call=lambda fn, a: fn(a["gate"], a["up"], a["approximate"]),
           rowwise=True, indeterminate=error_model.geglu_indeterminate),
        Op("gelu_and_mul", (X, APPROXIMATE), (Y,), ("x",),
           geglu.mul_forward, geglu.mul_vjp, error_model.gelu_and_mul_fwd, error_model.gelu_and_mul_bwd,
           call=lambda fn, a: fn(a["x"], a["approximate"]),
           rowwise=True, halves=True, indeterminate=error_model.gelu_and_mul_indeterminate),
    ]
}
