"""Liger-Kernel 0.8.5's Triton autograd functions under normcert's out-of-place contract.

    pip install --no-deps liger-kernel==0.8.5
    normcert certify rms_norm=liger:rms_norm gemma_rms_norm=liger:gemma_rms_norm \\
        add_rms_norm=liger:add_rms_norm layer_norm=liger:layer_norm swiglu=liger:swiglu

(run from this directory).  Each function is Liger's public ``*Function.apply``
with the arguments its own modules pass by default: LigerRMSNorm (offset 0,
casting mode "llama", in_place True: the backward writes dx over dy),
LigerRMSNormForGemma (offset 1, "gemma"), LigerFusedAddRMSNorm (in_place False).
"""
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.swiglu import LigerSiLUMulFunction


def rms_norm(x, weight, eps):
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", True)


def rms_norm_out_of_place(x, weight, eps):
    """LigerRMSNorm(in_place=False): the backward allocates dx instead of writing it over dy."""
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)


def gemma_rms_norm(x, weight, eps):
    return LigerRMSNormFunction.apply(x, weight, eps, 1.0, "gemma", True)


def add_rms_norm(x, residual, weight, eps):
    return LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, "llama", False)


# Liger's fused add takes a residual stream in x's dtype: given a float32 one beside a bfloat16 x it
# returns residual_out in bfloat16 (the stream silently narrowed), so it is certified on that domain
add_rms_norm.normcert_domain = "residual=same"


def layer_norm(x, weight, bias, eps):
    return LigerLayerNormFunction.apply(x, weight, bias, eps)


def swiglu(gate, up):
    return LigerSiLUMulFunction.apply(gate, up)
