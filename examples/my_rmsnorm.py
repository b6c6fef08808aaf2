"""A user's own RMSNorm, to certify with normcert:

    normcert certify rms_norm=examples.my_rmsnorm:rms_norm      (from the clone's root)

Contract: rms_norm(x, weight, eps) -> y with x's shape and dtype; compute in
float32 (float64 for float64 inputs); never write to the inputs.
"""
import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(compute)
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv_rms * weight.to(compute)).to(x.dtype)
