"""Liger-Kernel 0.8.5's Triton kernels as users import them, under normcert's contracts.

    pip install --no-deps liger-kernel==0.8.5
    normcert certify rms_norm=liger:rms_norm_llama gemma_rms_norm=liger:gemma_rms_norm \\
        add_rms_norm=liger:add_rms_norm layer_norm=liger:layer_norm swiglu=liger:swiglu_cloned \\
        silu_and_mul=liger:silu_and_mul geglu=liger:geglu_cloned rms_norm=liger:rms_norm_module

(run from this directory, or with it on PYTHONPATH).  Each function is Liger's public
``*Function.apply`` with the arguments its own modules pass; nothing of Liger is copied.

The declarations, and why:

* ``dtypes=float32,float16,bfloat16`` on every adapter: Liger computes in float32 whatever the
  input (a float64 x gives a float64 y of float32 accuracy; the RMSNorm backward raises
  ``KeyError: torch.float64``).  The ``*_all_dtypes`` adapters drop it, and are rejected in
  float64 for that real defect;
* ``dy=overwritten`` on the in-place RMSNorms (``in_place=True``, the default of ``LigerRMSNorm``
  and ``LigerRMSNormForGemma``): the backward writes dx over autograd's incoming gradient, a
  documented choice.  The ``*_in_place_undeclared`` adapters drop it and are rejected for it;
* ``residual=same`` on the fused add: Liger's residual stream is in x's dtype (a float32 residual
  beside a bfloat16 x comes back bfloat16);
* ``approximate=tanh`` on GeGLU: ``LigerGELUMulFunction`` computes ``gelu(approximate="tanh")`` only
  and takes no approximate argument.

SwiGLU's and GeGLU's backwards write dgate and dup over the caller's gate and up (Liger saves the
memory on purpose); no declaration admits that, so ``swiglu`` and ``geglu`` are rejected naming the
inputs written.  ``swiglu_cloned`` and ``geglu_cloned`` hand Liger copies (what a caller who needs
its activations afterwards must do) so that their arithmetic is judged on its own.
"""
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.geglu import LigerGELUMulFunction
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction, LigerSiLUMulFunction
from liger_kernel.transformers.rms_norm import LigerRMSNorm

NO_FLOAT64 = "dtypes=float32,float16,bfloat16"


def _rms_norm(mode, in_place, domain, doc):
    def rms_norm(x, weight, eps):
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, mode, in_place)

    rms_norm.__doc__ = doc
    rms_norm.normcert_domain = domain
    return rms_norm


rms_norm_llama = _rms_norm("llama", False, NO_FLOAT64, """LigerRMSNorm(casting_mode="llama",
    in_place=False): the inverse RMS in float32, x·rstd rounded to x's dtype before the weight; the
    backward allocates dx.  Declares no float64 (Liger computes it in float32).""")
rms_norm_gemma_casting = _rms_norm("gemma", False, NO_FLOAT64, """LigerRMSNorm(casting_mode="gemma",
    in_place=False), offset 0: x, weight and the product in float32, cast back at the end.""")
rms_norm_none_casting = _rms_norm("none", False, NO_FLOAT64, """LigerRMSNorm(casting_mode="none",
    in_place=False): no casting, x squared and summed in x's dtype (float16: |x| >= 256 squares to
    inf, and the row comes back as zeros: a real defect, not declared away).""")
rms_norm = _rms_norm("llama", True, NO_FLOAT64 + " dy=overwritten", """LigerRMSNorm's defaults
    (casting_mode="llama", in_place=True): the backward writes dx over dy, declared
    (dy=overwritten), so its gradients are held to the VJP of the dy it was handed.""")
rms_norm_gemma_casting_in_place = _rms_norm("gemma", True, NO_FLOAT64 + " dy=overwritten",
                                            """casting_mode="gemma", in_place=True, declared dy=overwritten.""")
rms_norm_none_casting_in_place = _rms_norm("none", True, NO_FLOAT64 + " dy=overwritten",
                                           """casting_mode="none", in_place=True, declared dy=overwritten.""")
rms_norm_in_place_undeclared = _rms_norm("llama", True, NO_FLOAT64, """LigerRMSNorm's defaults,
    in_place=True left undeclared: rejected, its backward writing into the incoming gradient of y
    (Liger#370: autograd may hand that dy to another use of y).""")
rms_norm_all_dtypes = _rms_norm("llama", False, "", """rms_norm_llama declaring nothing: rejected in
    float64, computed in float32 and returned as float64 (the backward raises KeyError).""")


def gemma_rms_norm(x, weight, eps):
    """LigerRMSNormForGemma: y = x·rstd·(1 + weight), casting "gemma", offset 1, in_place=True
    declared dy=overwritten."""
    return LigerRMSNormFunction.apply(x, weight, eps, 1.0, "gemma", True)


gemma_rms_norm.normcert_domain = NO_FLOAT64 + " dy=overwritten"


def gemma2_rms_norm(x, weight, eps):
    """LigerRMSNormForGemma2: as gemma_rms_norm with in_place=False (Liger#376), so nothing to declare
    but the dtypes."""
    return LigerRMSNormFunction.apply(x, weight, eps, 1.0, "gemma", False)


gemma2_rms_norm.normcert_domain = NO_FLOAT64


def add_rms_norm(x, residual, weight, eps):
    """LigerFusedAddRMSNorm (in_place=False): (norm(x + residual), x + residual).  Declares
    residual=same: given a float32 residual beside a bfloat16 x it returns residual_out in bfloat16."""
    return LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, "llama", False)


add_rms_norm.normcert_domain = NO_FLOAT64 + " residual=same"


def layer_norm(x, weight, bias, eps):
    """LigerLayerNorm: mean and rstd in float32, y in x's dtype."""
    return LigerLayerNormFunction.apply(x, weight, bias, eps)


layer_norm.normcert_domain = NO_FLOAT64


def swiglu(gate, up):
    """LigerSiLUMulFunction as Liger's MLP calls it: silu(gate)·up.  Its backward writes dgate and dup
    over gate and up (saved, not copied): rejected, the inputs written named."""
    return LigerSiLUMulFunction.apply(gate, up)


swiglu.normcert_domain = NO_FLOAT64


def swiglu_cloned(gate, up):
    """LigerSiLUMulFunction on copies of gate and up, so that the backward's writes land on the copies:
    its arithmetic judged alone."""
    return LigerSiLUMulFunction.apply(gate.clone(), up.clone())


swiglu_cloned.normcert_domain = NO_FLOAT64


def silu_and_mul(x):
    """LigerFusedGateUpSiLUMulFunction(x, in_place=False): silu(x[..., :H])·x[..., H:] on one fused
    [..., 2H] tensor (Megatron's linear_fc1 layout), normcert's silu_and_mul.  Its backward returns the
    gradient flattened to (-1, 2H), so every input of rank >= 3 fails gradients (a real defect)."""
    return LigerFusedGateUpSiLUMulFunction.apply(x, False)


silu_and_mul.normcert_domain = NO_FLOAT64


def geglu(gate, up, approximate):
    """LigerGELUMulFunction: gelu(gate, approximate="tanh")·up, whatever approximate says, so it declares
    approximate=tanh (its cases are fitted to the tanh form).  Its backward writes over gate and up:
    rejected, named."""
    return LigerGELUMulFunction.apply(gate, up)


geglu.normcert_domain = NO_FLOAT64 + " approximate=tanh"


def geglu_cloned(gate, up, approximate):
    """geglu on copies of gate and up: its arithmetic judged alone.  Its float16 backward rounds dy·up to
    float16 before gelu'(gate): gate 0.13037, up -65504, dy 1.30371 give dgate -inf for the exact
    -51531.98 (a real defect)."""
    return LigerGELUMulFunction.apply(gate.clone(), up.clone())


geglu_cloned.normcert_domain = NO_FLOAT64 + " approximate=tanh"

# LigerRMSNorm as an nn.Module instance (normcert copies it per case, sets variance_epsilon to the
# case's eps and calls it with the case's weight): its own choices kept.  The default instance writes
# dx over dy (in_place=True), declared; the Gemma2 one does not.
rms_norm_module = LigerRMSNorm(8)
rms_norm_module.normcert_domain = NO_FLOAT64 + " dy=overwritten"
rms_norm_module_out_of_place = LigerRMSNorm(8, in_place=False)
rms_norm_module_out_of_place.normcert_domain = NO_FLOAT64
