"""torchao 0.18's MXFP4 and NVFP4 quantisers after normcert's eager rms_norm / silu_and_mul, under
the FP4 ops' contract (rms_norm_fp4_quant, silu_and_mul_fp4_quant).

    pip install torchao==0.18.0
    normcert certify rms_norm_fp4_quant=torchao_fp4:rms_norm_fp4_floor \\
        silu_and_mul_fp4_quant=torchao_fp4:silu_and_mul_fp4_floor

(run from this directory).  Each adapter computes v with the registry's eager kernel (in x's dtype,
as a separate norm or SwiGLU layer would hand it over), then calls torchao: an "mxfp4" block goes to
``torchao.prototype.mx_formats.mx_tensor.to_mx`` (float4_e2m1fn_x2, block 32) in one of its four
``ScaleCalculationMode``s, an "nvfp4" block to ``nvfp4_tensor.nvfp4_quantize`` (block 16) with the
global scale as its ``per_tensor_scale`` (an empty batch is answered here: nvfp4_quantize cannot
reshape no rows); "swizzled" scales are laid out by torchao's own
``utils.to_blocked`` (the cuBLAS 128 x 4 tiles).  Nothing of torchao is copied here.

What each declares (``normcert_domain``) is torchao's documented rule, not a tolerance:

    FLOOR  mx_scale=floor   2**(floor(log2 amax) - 2), OCP MX 1.0 section 6.3 (torchao's default)
    CEIL   mx_scale=ceil    2**(ceil(log2 amax) - 2)
    EVEN   mx_scale=even    amax's significand rounded to one bit first
    RCEIL  mx_scale=rceil   2**ceil(log2(amax / 6)), cuBLAS's (normcert's default: nothing to declare)
    every one  block_floor=2^-6   nvfp4_quantize clamps each block scale to >= 2**-6 before its
           E4M3 cast
    dtypes=float32,float16,bfloat16   torchao quantises bfloat16 or float32 tensors (a float16 v is
           widened to float32 exactly; float64 would be rounded, outside what it takes)
"""
import torch
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
from torchao.prototype.mx_formats.utils import to_blocked

from normcert.impls import eager
from normcert.oracle.fp4 import padded


def _quantise(v, block_format, global_scale, layout, mode):
    """(y packed, scales in ``layout``) of v by torchao."""
    lead, n = v.shape[:-1], v.shape[-1]
    rows = (v if v.dtype == torch.bfloat16 else v.float()).reshape(-1, n).contiguous()  # torchao takes 2-D rows
    if rows.shape[0] == 0:  # nvfp4_quantize cannot reshape no rows ([0, -1, 16]): the empty batch here
        mx = block_format == "mxfp4"
        scales = torch.empty(0, n // (32 if mx else 16), dtype=torch.float8_e8m0fnu if mx else torch.float8_e4m3fn)
        y = torch.empty(0, n // 2, dtype=torch.uint8)
    elif block_format == "mxfp4":
        scales, y = to_mx(rows, torch.float4_e2m1fn_x2, 32, mode)
    else:
        scales, y = nvfp4_quantize(rows, 16, torch.tensor(float(global_scale), dtype=torch.float32))
    groups = n // (32 if block_format == "mxfp4" else 16)
    scales = scales.reshape(rows.shape[0], groups)
    if layout == "swizzled":
        scales = to_blocked(scales.view(torch.uint8)).view(scales.dtype).reshape(padded(rows.shape[0], groups))
    else:
        scales = scales.reshape(*lead, groups)
    return y.reshape(*lead, n // 2), scales


def _adapters(mode, domain):
    def rms_norm_fp4(x, weight, eps, block_format, global_scale, layout):
        return _quantise(eager.rms_norm(x, weight, eps), block_format, global_scale, layout, mode)

    def silu_and_mul_fp4(x, block_format, global_scale, layout):
        return _quantise(eager.silu_and_mul(x), block_format, global_scale, layout, mode)

    for fn in (rms_norm_fp4, silu_and_mul_fp4):
        fn.normcert_domain = domain
    return rms_norm_fp4, silu_and_mul_fp4


_BOTH = "dtypes=float32,float16,bfloat16 block_floor=2^-6"
rms_norm_fp4_floor, silu_and_mul_fp4_floor = _adapters(ScaleCalculationMode.FLOOR, f"{_BOTH} mx_scale=floor")
rms_norm_fp4_ceil, silu_and_mul_fp4_ceil = _adapters(ScaleCalculationMode.CEIL, f"{_BOTH} mx_scale=ceil")
rms_norm_fp4_even, silu_and_mul_fp4_even = _adapters(ScaleCalculationMode.EVEN, f"{_BOTH} mx_scale=even")
rms_norm_fp4_rceil, silu_and_mul_fp4_rceil = _adapters(ScaleCalculationMode.RCEIL, _BOTH)
