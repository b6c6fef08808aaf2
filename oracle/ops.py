"""The ops normcert knows: one ``Op`` record each (see ``record``).

The call conventions are the contract in docs/reference/op-contracts.md: out-of-place, tensors
positional in the order below, eps last; rms_norm's weight and layer_norm's
weight and bias may be None (ones, zeros); batch_norm takes ``mask=`` by keyword;
deep_norm takes its sublayer as a callable (the suite's affine one); GELU's form
(``approximate``, "none" or "tanh") is the last argument of geglu and gelu_and_mul;
the FP8 ops take the static scale last, after eps, and return float8_e4m3fn; the gated RMSNorm
takes its gate z after x and ``norm_before_gate`` (a bool) last, then ``group_size=`` by keyword where
a case has groups (None, the whole row, is not passed: an option, ``record.Arg.option``, so a kernel
of the five-argument convention written before it, transformers' ``Qwen3NextRMSNormGated``, is called
as it always was and certified on the cases without groups); the dynamically quantised norms take
``qdtype`` and ``scale_ub`` last and return (y, scales[, residual_out]); a fused op's
residual may be kept in float32 while x is float16 or bfloat16, and its residual_out is then float32.

Derived forms take their oracle and bounds from their base op's by factory (``fused``,
``quantised``, ``halves`` and ``bounds_derived``): add_rms_norm is rms_norm fused with the residual
add, rms_norm_fp8 is rms_norm quantised, add_rms_norm_fp8 is rms_norm_fp8 fused with the residual
add, add_layer_norm is layer_norm fused with it, rms_norm_dynamic_quant is rms_norm quantised with
its own per-row scales and add_rms_norm_dynamic_quant that fused with the residual add,
rms_norm_group_quant is rms_norm quantised per group and add_rms_norm_group_quant that fused with
the residual add, silu_and_mul and gelu_and_mul are swiglu and geglu on the two halves of x,
silu_and_mul_dynamic_quant and silu_and_mul_group_quant are silu_and_mul quantised per row and per
group of its output row (the MoE path's SwiGLU + FP8 quant: vLLM's ``silu_and_mul_quant``, DeepGEMM's
1 x 128 activations); silu_and_mul_group_quant_masked is the last on (experts, tokens, 2H) with the
first counts[e] tokens of each expert valid (``_counted``: vLLM's ``_silu_mul_fp8_quant_deep_gemm``,
SGLang's ``silu_and_mul_masked_post_quant_fwd``); rms_norm_fp4_quant is rms_norm quantised to FP4 per
block (``fp4``: NVFP4 or MXFP4, y packed two to a byte, block scales linear or swizzled, after a
global scale), add_rms_norm_fp4_quant that fused with the residual add, silu_and_mul_fp4_quant
silu_and_mul quantised to FP4 the same way (the MoE path's SwiGLU output).  Each
factory is given the derived op's own signature (a fused or quantised op's weight is required where
rms_norm's is optional); the argument names it needs come from the records, and the drawing limits
(``width_multiple``, ``max_width``, ``max_rank``) from the base op's.
"""
from __future__ import annotations

import mpmath
import numpy as np
import torch

from . import (batch_norm, bounds_derived, bounds_gated, bounds_gated_norm, bounds_norms, bounds_quant, deep_norm,
               dynamic_quant, fp4, fused, geglu, gemma_rms_norm, halves, layer_norm, quantised, rms_norm, rms_norm_gated,
               swiglu)
from .kinds import GROUPS
from .record import Arg, Op, Out

X, RESIDUAL, WEIGHT, BIAS, EPS = Arg("x", "rows"), Arg("residual", "stream"), Arg("weight", "weight"), \
    Arg("bias", "bias"), Arg("eps", "eps")
GATE, UP = Arg("gate", "rows"), Arg("up", "rows")
APPROXIMATE = Arg("approximate", "approximate")
MLP_WIDTH = 53248
"""The gated activations' longest row (``Op.max_width``): an MLP's intermediate width, up to Llama-3.1
405B's 53,248 (its ``config.json``); the norms' rows, hidden sizes, stay within the default 16,384.  A
halves op's x holds two such rows."""
SCALE = Arg("scale", "scale")
Y, RESIDUAL_OUT = Out("y"), Out("residual_out", like="residual", rounded=True)  # x + residual, rounded once
Y_FP8 = Out("y", dtype=torch.float8_e4m3fn, quantised=True)
WEIGHTLESS_WEIGHT, WEIGHTLESS_BIAS = Arg("weight", "weight", optional=True), Arg("bias", "bias", optional=True)
QDTYPE, SCALE_UB = Arg("qdtype", "qdtype"), Arg("scale_ub", "scale_ub")
NAN = Arg("nan", "nan")  # a contract choice (``kinds``): the amax's NaN policy, never passed to a kernel
FLOOR = Arg("scale_floor", "scale_floor")  # a contract choice: the dynamic scale's floor
TAIL = Arg("tail", "tail")  # a contract choice: a per-group op's last group, whole or partial
Y_DYNAMIC = Out("y", dtype_arg="qdtype", quantised=True, scale="scales")  # divided by the kernel's own scale
SCALES = Out("scales", dtype=torch.float32, shape="leading")  # one per row, float32
GROUP, SCALE_FORMAT, LAYOUT = Arg("group", "group"), Arg("scale_format", "scale_format"), Arg("layout", "layout")
Y_GROUP = Out("y", dtype=torch.float8_e4m3fn, quantised=True, scale="scales")  # divided by its group's scale
GROUP_SCALES = Out("scales", dtype=torch.float32, shape="groups", group_arg="group", format_arg="scale_format",
                   layout_arg="layout")  # one per group, float32 holding a float32 or UE8M0 value
BLOCK_FORMAT, GLOBAL_SCALE, BLOCK_LAYOUT = Arg("block_format", "block_format"), Arg("global_scale", "global_scale"), \
    Arg("layout", "block_layout")
MX_SCALE, BLOCK_FLOOR = Arg("mx_scale", "mx_scale"), Arg("block_floor", "block_floor")  # contract choices (``fp4_scales``)
MX_GLOBAL = Arg("mx_global_scale", "mx_global_scale")  # a contract choice: an MXFP4 kernel takes a global scale
ARITHMETIC = Arg("arithmetic", "arithmetic")  # a contract choice: IEEE division and square root (``lattice``)
INTERMEDIATE = Arg("intermediate", "intermediate")  # a contract choice: v held in float32 or x's dtype (``bounds_quant``)
Y_FP4 = Out("y", dtype=torch.uint8, quantised=True, packed=True, scale="scales")  # e2m1 codes, two a byte
BLOCK_SCALES = Out("scales", dtype_arg="block_format", shape="groups", group_arg="block_format",
                   format_arg="block_format", layout_arg="layout")  # E4M3 or UE8M0, one per block


def _on_halves(name: str, base: Op, args: tuple[Arg, ...], call) -> Op:
    """base on the two halves of args[0], the main tensor: its last dim is [first | second] of
    base's row inputs (``record.Op.halves``); oracle and bounds derived from base's."""
    main, parts = args[0].name, base.row_inputs
    oracle, bound = (lambda f: halves.oracle(f, main, parts)), (lambda f: bounds_derived.halves(f, main, parts))
    return Op(name, args, base.outs, (main,), oracle(base.forward), oracle(base.vjp),
              bound(base.forward_bound), bound(base.grad_bound), call=call,
              rowwise=base.rowwise, halves=True, indeterminate=bound(base.indeterminate),
              max_width=2 * base.max_width)


def _fused(name: str, base: Op, args: tuple[Arg, ...], call) -> Op:
    """base fused with the residual add (``oracle.fused``): ``args`` are base's with the residual,
    args[1], after the main tensor, args[0]; outputs base's then residual_out; gradients base's and
    the residual's; oracle and bounds derived from base's, which must be scale invariant."""
    main, residual = args[0].name, args[1].name
    eps = next(a.name for a in base.args if a.kind == "eps")
    if not base.scale_invariant:
        raise ValueError(f"Op {name}: the fused oracle scales an overflowing sum, "
                         f"so {base.name} must be scale invariant")
    grads = tuple(a.name for a in args if a.name in base.grads or a.name == residual) if base.grads else ()
    return Op(name, args, (*base.outs, RESIDUAL_OUT), grads,
              fused.forward(base.forward, main, residual, eps),
              base.vjp and fused.vjp(base.vjp, main, residual, eps),
              bounds_derived.fused_forward(base.forward_bound, main, residual),
              base.grad_bound and bounds_derived.fused_grad(base.grad_bound, main, residual),
              call=call, rowwise=base.rowwise, scale_invariant=True, unfused=base.name, centred=base.centred,
              width_multiple=base.width_multiple, max_width=base.max_width, max_rank=base.max_rank)


def _quantised(name: str, base: Op, args: tuple[Arg, ...], call) -> Op:
    """base with its first output divided by a static scale, the last of ``args``, and quantised to
    float8_e4m3fn (``oracle.quantised``); an inference op, no gradients."""
    main, scale = args[0].name, args[-1].name
    return Op(name, args, (Y_FP8, *base.outs[1:]), (), quantised.forward(base.forward, scale), None,
              bounds_derived.quantised(base.forward_bound, main, scale), None, call=call,
              rowwise=base.rowwise, scale_invariant=base.scale_invariant, max_width=base.max_width)


def _dynamic_quantised(name: str, base: Op, args: tuple[Arg, ...], call) -> Op:
    """base with its first output quantised with a scale per row it computes (``oracle.dynamic_quant``):
    outputs (y in the qdtype argument's format, the scales, base's others); an inference op.  A
    halves base (silu_and_mul) gives a halves op, one scale per output row."""
    main = args[0].name
    qdtype, scale_ub, nan, floor = (next(a.name for a in args if a.kind == k)
                                    for k in ("qdtype", "scale_ub", "nan", "scale_floor"))
    return Op(name, args, (Y_DYNAMIC, SCALES, *base.outs[1:]), (),
              dynamic_quant.forward(base.forward, qdtype, scale_ub, nan, floor),
              None, bounds_quant.dynamic(base.forward_bound, main, qdtype, nan, base.indeterminate), None, call=call,
              rowwise=base.rowwise, scale_invariant=base.scale_invariant, halves=base.halves, max_width=base.max_width)


def _group_quantised(name: str, base: Op, args: tuple[Arg, ...], call) -> Op:
    """base with its first output quantised to float8_e4m3fn with a scale per group of a row it
    computes (``oracle.dynamic_quant.group_forward``): outputs (y, the scales, base's others); output
    rows a multiple of the largest group drawn (a kernel that declares tail=partial is fitted rows that
    are not: ``properties.search.fitting``); an inference op.  A halves base (silu_and_mul) gives a
    halves op: the groups are of its output row, x's two halves are never grouped across."""
    main = args[0].name
    group, form, layout, nan, floor, tail = (next(a.name for a in args if a.kind == k)
                                             for k in ("group", "scale_format", "layout", "nan", "scale_floor", "tail"))
    return Op(name, args, (Y_GROUP, GROUP_SCALES, *base.outs[1:]), (),
              dynamic_quant.group_forward(base.forward, "float8_e4m3fn", group, form, layout, nan, floor, tail), None,
              bounds_quant.per_group(base.forward_bound, main, "float8_e4m3fn", group, form, nan, base.indeterminate),
              None,
              call=call, rowwise=base.rowwise, scale_invariant=base.scale_invariant, width_multiple=max(GROUPS),
              halves=base.halves, max_width=base.max_width)


def _zero_padding(x, counts):
    """x (numpy, float64 or mpmath objects; or torch) with every row t >= counts[e] of each expert set
    to 0: the rows outside a masked op's contract, never read (``record.Op.valid``)."""
    if counts is None:
        return x
    valid = np.arange(x.shape[-2]) < np.asarray(counts)[..., None]
    if isinstance(x, torch.Tensor):
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        return torch.where(torch.from_numpy(valid).to(x.device)[..., None], x, zero)
    out = x.copy()
    out[~valid] = mpmath.mpf(0) if out.dtype == object else 0.0  # mpmath's arrays hold mpf objects
    return out


def _counted(name: str, base: Op, args: tuple[Arg, ...], call) -> Op:
    """base on an x of shape (experts..., tokens, n) of which only the first counts[e] rows of each
    expert are valid, counts (an argument of kind "counts") after x: the masked MoE form.  The rows
    past counts[e] are outside the contract: the oracle and the bounds read them as zeros (so that
    their values, which the padding strategy overwrites with NaN or huge numbers, cost nothing) and
    no check reads the outputs there (``Op.valid``); a kernel must not write outside its own outputs
    (the calling contract: ``properties.harness.sandbox``).  Oracle and bounds are base's, rows being rows."""
    main, counts = args[0].name, next(a.name for a in args if a.kind == "counts")

    def forward(B, **a):
        c = a.pop(counts)
        return base.forward(B, **{**a, main: _zero_padding(a[main], c)})

    def bound(a, exact, kernel=True, **kw):
        rest = {k: v for k, v in a.items() if k != counts}
        rest[main] = _zero_padding(a[main], a[counts].detach().cpu().numpy())
        return base.forward_bound(rest, exact, kernel, **kw)

    return Op(name, args, base.outs, (), forward, None, bound, None, call=call, rowwise=base.rowwise,
              halves=base.halves, width_multiple=base.width_multiple, max_width=base.max_width,
              max_rank=base.max_rank)


def _fp4_quantised(name: str, base: Op, args: tuple[Arg, ...], call, exact=None) -> Op:
    """base with its first output quantised to FP4 with a scale per block it computes
    (``oracle.fp4``): outputs (y packed, the block scales in their layout, base's others); rows a
    multiple of the largest block (twice that for a halves op: the multiple is the main tensor's
    width); an inference op.  ``exact``: base's exactly computed rows (``lattice``), if any."""
    main = args[0].name
    form, scale, layout, nan = (next(a.name for a in args if a.kind == k)
                                for k in ("block_format", "global_scale", "block_layout", "nan"))
    return Op(name, args, (Y_FP4, BLOCK_SCALES, *base.outs[1:]), (), fp4.forward(base.forward, form, scale, layout, nan),
              None, bounds_quant.block(base.forward_bound, main, form, scale, nan, base.indeterminate, exact), None, call=call,
              rowwise=base.rowwise, scale_invariant=base.scale_invariant, halves=base.halves,
              width_multiple=fp4.MAX_BLOCK * (2 if base.halves else 1), max_width=base.max_width,
              max_rank=base.max_rank)


RMS_NORM = Op("rms_norm", (X, WEIGHTLESS_WEIGHT, EPS), (Y,), ("x", "weight"),
              rms_norm.forward, rms_norm.vjp, bounds_norms.rms_norm_fwd, bounds_norms.rms_norm_bwd,
              call=lambda fn, a: fn(a["x"], a["weight"], a["eps"]),
              rowwise=True, scale_invariant=True, headwise=True)
ADD_RMS_NORM = _fused("add_rms_norm", RMS_NORM, (X, RESIDUAL, WEIGHT, EPS),
                      call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"]))
RMS_NORM_DYNAMIC_QUANT = _dynamic_quantised(
    "rms_norm_dynamic_quant", RMS_NORM, (X, WEIGHT, EPS, QDTYPE, SCALE_UB, NAN, FLOOR),
    call=lambda fn, a: fn(a["x"], a["weight"], a["eps"], a["qdtype"], a["scale_ub"]))
RMS_NORM_GROUP_QUANT = _group_quantised(
    "rms_norm_group_quant", RMS_NORM, (X, WEIGHT, EPS, GROUP, SCALE_FORMAT, LAYOUT, NAN, FLOOR, TAIL),
    call=lambda fn, a: fn(a["x"], a["weight"], a["eps"], a["group"], a["scale_format"], a["layout"]))
RMS_NORM_FP4_QUANT = _fp4_quantised(
    "rms_norm_fp4_quant", RMS_NORM,
    (X, WEIGHT, EPS, BLOCK_FORMAT, GLOBAL_SCALE, BLOCK_LAYOUT, NAN, MX_SCALE, BLOCK_FLOOR, MX_GLOBAL, ARITHMETIC,
     INTERMEDIATE),
    call=lambda fn, a: fn(a["x"], a["weight"], a["eps"], a["block_format"], a["global_scale"], a["layout"]),
    exact=bounds_norms.rms_norm_exact)
RMS_NORM_FP8 = _quantised("rms_norm_fp8", RMS_NORM, (X, WEIGHT, EPS, SCALE),
                          call=lambda fn, a: fn(a["x"], a["weight"], a["eps"], a["scale"]))
LAYER_NORM = Op("layer_norm", (X, WEIGHTLESS_WEIGHT, WEIGHTLESS_BIAS, EPS), (Y,), ("x", "weight", "bias"),
                layer_norm.forward, layer_norm.vjp, bounds_norms.layer_norm_fwd, bounds_norms.layer_norm_bwd,
                call=lambda fn, a: fn(a["x"], a["weight"], a["bias"], a["eps"]),
                rowwise=True, scale_invariant=True, shift_invariant=True, headwise=True, centred=True)
SWIGLU = Op("swiglu", (GATE, UP), (Y,), ("gate", "up"),
            swiglu.forward, swiglu.vjp, bounds_gated.swiglu_fwd, bounds_gated.swiglu_bwd,
            call=lambda fn, a: fn(a["gate"], a["up"]),
            rowwise=True, indeterminate=bounds_gated.swiglu_indeterminate, max_width=MLP_WIDTH)
SILU_AND_MUL = _on_halves("silu_and_mul", SWIGLU, (X,), call=lambda fn, a: fn(a["x"]))
SILU_AND_MUL_DYNAMIC_QUANT = _dynamic_quantised(
    "silu_and_mul_dynamic_quant", SILU_AND_MUL, (X, QDTYPE, SCALE_UB, NAN, FLOOR),
    call=lambda fn, a: fn(a["x"], a["qdtype"], a["scale_ub"]))
SILU_AND_MUL_GROUP_QUANT = _group_quantised(
    "silu_and_mul_group_quant", SILU_AND_MUL, (X, GROUP, SCALE_FORMAT, LAYOUT, NAN, FLOOR, TAIL),
    call=lambda fn, a: fn(a["x"], a["group"], a["scale_format"], a["layout"]))
SILU_AND_MUL_GROUP_QUANT_MASKED = _counted(
    "silu_and_mul_group_quant_masked", SILU_AND_MUL_GROUP_QUANT, (X, Arg("counts", "counts"), GROUP, SCALE_FORMAT, LAYOUT, NAN, FLOOR, TAIL),
    call=lambda fn, a: fn(a["x"], a["counts"], a["group"], a["scale_format"], a["layout"]))
GEGLU = Op("geglu", (GATE, UP, APPROXIMATE), (Y,), ("gate", "up"),
           geglu.forward, geglu.vjp, bounds_gated.geglu_fwd, bounds_gated.geglu_bwd,
           call=lambda fn, a: fn(a["gate"], a["up"], a["approximate"]),
           rowwise=True, indeterminate=bounds_gated.geglu_indeterminate, max_width=MLP_WIDTH)

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
        Op("rms_norm_gated", (X, Arg("z", "rows"), WEIGHT, EPS, Arg("norm_before_gate", "flag"),
                              Arg("group_size", "group_size", option=True)), (Y,),
           ("x", "z", "weight"), rms_norm_gated.forward, rms_norm_gated.vjp,
           bounds_gated_norm.rms_norm_gated_fwd, bounds_gated_norm.rms_norm_gated_bwd,
           call=lambda fn, a: fn(a["x"], a["z"], a["weight"], a["eps"], a["norm_before_gate"]),
           rowwise=True, headwise=True, indeterminate=bounds_gated_norm.rms_norm_gated_indeterminate),
        RMS_NORM_FP8,
        _fused("add_rms_norm_fp8", RMS_NORM_FP8, (X, RESIDUAL, WEIGHT, EPS, SCALE),
               call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"], a["scale"])),
        RMS_NORM_DYNAMIC_QUANT,
        _fused("add_rms_norm_dynamic_quant", RMS_NORM_DYNAMIC_QUANT, (X, RESIDUAL, WEIGHT, EPS, QDTYPE, SCALE_UB, NAN, FLOOR),
               call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"], a["qdtype"], a["scale_ub"])),
        RMS_NORM_GROUP_QUANT,
        _fused("add_rms_norm_group_quant", RMS_NORM_GROUP_QUANT, (X, RESIDUAL, WEIGHT, EPS, GROUP, SCALE_FORMAT, LAYOUT, NAN, FLOOR, TAIL),
               call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"], a["group"], a["scale_format"],
                                     a["layout"])),
        RMS_NORM_FP4_QUANT,
        _fused("add_rms_norm_fp4_quant", RMS_NORM_FP4_QUANT,
               (X, RESIDUAL, WEIGHT, EPS, BLOCK_FORMAT, GLOBAL_SCALE, BLOCK_LAYOUT, NAN, MX_SCALE, BLOCK_FLOOR, MX_GLOBAL,
                ARITHMETIC, INTERMEDIATE),
               call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["eps"], a["block_format"],
                                     a["global_scale"], a["layout"])),
        LAYER_NORM,
        _fused("add_layer_norm", LAYER_NORM, (X, RESIDUAL, WEIGHT, BIAS, EPS),
               call=lambda fn, a: fn(a["x"], a["residual"], a["weight"], a["bias"], a["eps"])),
        Op("batch_norm", (X, WEIGHT, BIAS, Arg("mask", "mask"), EPS), (Y,), ("x", "weight", "bias"),
           batch_norm.forward, batch_norm.vjp, bounds_norms.batch_norm_fwd, bounds_norms.batch_norm_bwd,
           call=lambda fn, a: fn(a["x"], a["weight"], a["bias"], a["eps"], mask=a["mask"]),
           rowwise=False, scale_invariant=True, shift_invariant=True, centred=True),
        Op("deep_norm", (X, Arg("sub_weight", "matrix"), Arg("sub_bias", "vector"), WEIGHT, BIAS,
                         Arg("alpha", "alpha"), EPS), (Y,), ("x", "weight", "bias"),
           deep_norm.forward, deep_norm.vjp, bounds_norms.deep_norm_fwd, bounds_norms.deep_norm_bwd,
           call=lambda fn, a: fn(a["x"], deep_norm.affine_sublayer(a["sub_weight"], a["sub_bias"]), a["alpha"],
                                 a["weight"], a["bias"], a["eps"]),
           rowwise=True, max_width=128, max_rank=3, centred=True),
        SWIGLU,
        SILU_AND_MUL,
        SILU_AND_MUL_DYNAMIC_QUANT,
        SILU_AND_MUL_GROUP_QUANT,
        SILU_AND_MUL_GROUP_QUANT_MASKED,
        _fp4_quantised("silu_and_mul_fp4_quant", SILU_AND_MUL, (X, BLOCK_FORMAT, GLOBAL_SCALE, BLOCK_LAYOUT, NAN, MX_SCALE,
                                                                BLOCK_FLOOR, MX_GLOBAL, ARITHMETIC, INTERMEDIATE),
                       call=lambda fn, a: fn(a["x"], a["block_format"], a["global_scale"], a["layout"])),
        GEGLU,
        _on_halves("gelu_and_mul", GEGLU, (X, APPROXIMATE), call=lambda fn, a: fn(a["x"], a["approximate"])),
    ]
}
