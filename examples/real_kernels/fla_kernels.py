"""flash-linear-attention's Triton norms and SwiGLU (``fla-core``, pure Triton, every kernel
``@triton.autotune``d), called the way its own modules call them:

    pip install --no-deps fla-core einops
    normcert certify rms_norm=fla_kernels:rms_norm add_rms_norm=fla_kernels:add_rms_norm \\
        layer_norm=fla_kernels:layer_norm swiglu=fla_kernels:swiglu

(run from this directory).  ``rms_norm`` and ``layer_norm`` are ``fla.modules.norm``'s
functional forms as ``RMSNorm`` / ``LayerNorm`` call them; ``add_rms_norm`` is the same
kernel with a residual and ``prenorm=True``, which returns (y, residual_out) with
residual_out in the residual's dtype (a float32 residual stream is taken as it is: the
contract's ``residual_in_fp32``); ``swiglu`` is ``fla.modules.activations.swiglu``, the
``SwiGLUFunction`` its fused MLP uses.  normcert runs each kernel under every config its
autotuner may pick (on CPU, Triton's interpreter: configs told apart by their kwargs).

Every fla kernel computes in float32 whatever the input (a design: float64 inputs come back
float32-accurate, and float64 rows past 8192 elements raise "feature dim >= 64KB"), so each
adapter declares the three dtypes it is built for; the certificate says "certified on: dtypes
float32, float16, bfloat16".
"""
from fla.modules.activations import swiglu as _swiglu
from fla.modules.norm.layernorm import layer_norm as _layer_norm
from fla.modules.norm.layernorm import rms_norm as _rms_norm


def rms_norm(x, weight, eps):
    return _rms_norm(x, weight, None, eps=eps)


def add_rms_norm(x, residual, weight, eps):
    return _rms_norm(x, weight, None, residual=residual, eps=eps, prenorm=True)


def layer_norm(x, weight, bias, eps):
    return _layer_norm(x, weight, bias, eps=eps)


def swiglu(gate, up):
    return _swiglu(gate, up)


for _kernel in (rms_norm, add_rms_norm, layer_norm, swiglu):
    _kernel.normcert_domain = "dtypes=float32,float16,bfloat16"
