"""PyTorch's own functional ops, called the way model code calls them: in the input's dtype.

    normcert certify rms_norm=torch_functional:rms_norm layer_norm=torch_functional:layer_norm \\
        swiglu=torch_functional:swiglu silu_and_mul=torch_functional:silu_and_mul \\
        geglu=torch_functional:geglu

(run from this directory).  ``swiglu``, ``silu_and_mul`` and ``geglu`` are the usual
one-liners ``F.silu(gate) * up`` and ``F.gelu(gate, approximate=...) * up``: two operations, each rounded to the input's
dtype, which is the question the certificate answers for them.  On CPU,
``F.layer_norm`` refuses float32 weights for a lower-precision x (the contract
allows them): ``layer_norm`` declares its domain (``params=same``), and the
certificate says "certified on: weights in x's dtype".
"""
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


layer_norm.normcert_domain = "params=same"  # the contract allows float32 weights; CPU torch does not


def swiglu(gate, up):
    return F.silu(gate) * up


def silu_and_mul(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def geglu(gate, up, approximate):
    return F.gelu(gate, approximate=approximate) * up
