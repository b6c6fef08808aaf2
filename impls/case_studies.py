"""Case studies: normalisation / activation designs taken from published tutorials.

Each function below re-implements one design from a seed tutorial
(``../shared/seeds/*.txt``, beside the repository) to the kernel contract -- same design decisions, same
order of operations, same precisions -- so that the suite can say what is
wrong with it.  They are *not* implementations to use.  Every one is
registered with the one-line reason the suite rejects it (``expected_failure``);
the docstring says which seed it comes from, what it reproduces, and the
smallest failing input found by hand (error measured with ``oracle`` and
``oracle.error_model``; "units" is error / bound, > 1 fails).

Two things hold for every ``torch.compile`` design here (compiled as the seeds
do: plain ``@torch.compile``, default settings):

* inductor keeps the eager aliasing and mutation semantics: the in-place
  designs mutate the caller's float32 tensor, and return it, compiled or not;
* Dynamo recompiles a function for each new dtype, rank, requires_grad, size 0 or 1, ... and,
  past ``recompile_limit`` (8) recompilations, silently runs it eagerly.  normcert's kernel thread
  raises that limit so that every call runs compiled code (``properties.harness.sandbox.RECOMPILE_LIMIT``);
  checked so, the three compiled designs cost 360 s of the default CPU run (2 cores), so they are
  registered for GPU runs (``COMPILED_DEVICES``), and each has an ``-eager`` twin, registered
  for the same reasons, that runs everywhere.

Reference facts used below (torch 2.13, CPU):
  * ``t.float()`` / ``t.to(t.dtype)`` return ``t`` itself, not a copy;
  * ``F.layer_norm`` on CPU refuses a float64 input with a float32 weight
    ("mixed dtype (CPU): all inputs must share same datatype"), and for
    bfloat16/float16 inputs its backward accumulates dweight/dbias in the
    input's precision (8x512 rows: db off by 64 ulp (bf16), 84 ulp (fp16)).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import make
from .compiled import compiled_at_first_call


# ================================================================ seed 000 / 003: nano-vllm RMSNorm
def _seed000_rms(x, weight, eps):
    # orig dtype, upcast "to float32", mean square, normalise IN PLACE, cast back and scale IN PLACE
    orig = x.dtype
    h = x.float()  # float32 x: h is x itself; float64 x: a float32 copy (precision lost)
    ms = h.pow(2).mean(dim=-1, keepdim=True)
    h.mul_(torch.rsqrt(ms + eps))
    return h.to(orig).mul_(weight)


def seed000_rms_eager(x, weight, eps):
    """Seed 000 (nano-vllm ch.12, ``RMSNorm.rms_forward``; the same code is seed 003's), run eagerly.

    Design: ``x = x.float()``, ``x.mul_(rsqrt(mean(x^2) + eps))``, then
    ``x.to(orig_dtype).mul_(weight)`` -- in-place ops to save memory.

    What the suite finds:
      * float32: ``x.float()`` *is* x, so the normalisation is written into
        the caller's tensor and the returned y is that same tensor
        (contract: input mutated).  x=[[3., 4.]], w=[1, 1], eps=1e-6: the
        caller's x becomes [[0.8485, 1.1314]].  (The value of y is correct.)
      * float64: ``.float()`` downcasts, so the whole computation is float32:
        x=[[0.1]], w=[1.], eps=1e-6 gives 0.99994993 for exact 0.99995000,
        7.2e-8 off = 4.3e7 units (6.5e8 ulp of float64).
      * bfloat16 / float16: correct (one float32 computation, two roundings).
      * backward: raises in every dtype (float32: "a leaf Variable that
        requires grad is being used in an in-place operation"; otherwise
        "one of the variables needed for gradient computation has been
        modified by an inplace operation" -- pow saved h, mul_ overwrote it).
        nano-vllm is an inference engine, so this is registered without
        backward (the suite lets a backward RuntimeError escape as an error).
    """
    return _seed000_rms(x, weight, eps)


seed000_rms = compiled_at_first_call(_seed000_rms)
seed000_rms.__doc__ = """Seed 000 ``rms_forward`` compiled as the seed does (``@torch.compile``).

Same findings as ``seed000_rms_eager``: compiled, the float32 caller's x is
still overwritten and y still aliases it (inductor preserves the mutation);
float64 is computed in float32 (x=[[0.1]]: 3.1e7 units); bfloat16/float16 are
correct (rounded once, <= 0.5 ulp).  Backward fails to compile
(TorchRuntimeError / BackendCompilerFailed): registered without backward.
"""


def _seed000_add_rms(x, residual, weight, eps):
    orig = x.dtype
    s = x.float().add_(residual.float())  # float32: adds INTO the caller's x
    res_out = s.to(orig)  # float32: the same tensor as s (and as x)
    ms = s.pow(2).mean(dim=-1, keepdim=True)
    s.mul_(torch.rsqrt(ms + eps))  # ... so this normalises res_out as well
    return s.to(orig).mul_(weight), res_out


def seed000_add_rms_eager(x, residual, weight, eps):
    """Seed 000 ``RMSNorm.add_rms_forward`` (fused residual add + RMSNorm), run eagerly.

    Design: ``x = x.float().add_(residual.float())``; ``residual = x.to(orig)``;
    normalise x in place; ``x.to(orig).mul_(weight)``; return (x, residual).

    What the suite finds:
      * float32: ``x.float()`` is x, so ``add_`` writes x + r into the
        caller's x, ``x.to(float32)`` is again the same tensor, and the
        in-place normalisation then overwrites it: the caller's x ends up
        holding y, and the returned residual *is* y (same storage), not
        x + r.  x=[[1., 2.]], r=[[2., 2.]], w=[1, 1]: returns residual
        [[0.8485, 1.1314]] for [[3., 4.]], and x is mutated to the same.
        Contract: input x mutated; residual_out not the rounded sum (bound 0).
      * float64: x and r are rounded to float32 before the add: x=[[0.1]],
        r=[[0.2]] gives residual 0.30000001192092896 (not bit-exact), y 2.5e7 units.
      * bfloat16 / float16: correct (the float32 sum is a fresh tensor).
      * backward: raises (in-place on a tensor saved for backward);
        registered without backward.
    """
    return _seed000_add_rms(x, residual, weight, eps)


seed000_add_rms = compiled_at_first_call(_seed000_add_rms)
seed000_add_rms.__doc__ = """Seed 000 ``add_rms_forward`` compiled as the seed does.

Compiled behaves as eager (``seed000_add_rms_eager``): float32 x mutated into
y, returned residual aliases y; float64 computed in float32; bf16/fp16 correct.
"""


def _seed003_add_rms(x, residual, weight, eps):
    orig = x.dtype
    s = x.float().add(residual.float())  # out of place: a fresh tensor, x untouched
    res_out = s.to(orig)  # float32: still the same tensor as s
    ms = s.pow(2).mean(dim=-1, keepdim=True)
    s.mul_(torch.rsqrt(ms + eps))
    return s.to(orig).mul_(weight), res_out


seed003_add_rms = compiled_at_first_call(_seed003_add_rms)
seed003_add_rms.__doc__ = """Seed 003 (zhihu RMSNorm walk-through) ``add_rms_forward``, compiled as the seed does.

The only difference from seed 000 is ``x.float().add(residual.float())``
(out of place) instead of ``.add_``.  That fixes the mutation -- the caller's
x and residual are untouched in every dtype -- but not the aliasing: for
float32, ``s.to(float32)`` is s, which is then normalised in place, so the
returned residual is y, not x + r.  x=[[1., 2.]], r=[[2., 2.]], w=[1, 1]:
residual [[0.8485, 1.1314]] for [[3., 4.]] (residual_out must be bit-exact).
float64 as seed 000 (float32 arithmetic); bf16/fp16 correct.  Eager behaves
the same.  Seed 003's ``rms_forward`` is seed 000's, character for character
(see ``seed000_rms``).  Backward raises: registered without backward.
"""


def seed003_add_rms_eager(x, residual, weight, eps):
    """``seed003_add_rms`` without ``torch.compile``: the same findings (the module docstring says
    why both are registered)."""
    return _seed003_add_rms(x, residual, weight, eps)


# ================================================================ seed 000: nano-vllm SiluAndMul
def seed000_silu_and_mul_eager(x):
    """Seed 000 ``SiluAndMul.forward``: ``x, y = x.chunk(2, -1); return F.silu(x) * y``, eagerly.

    Forward: correct in every dtype (F.silu rounds once, the product once).
    What the suite finds (gradients, float16): autograd forms dy * up in
    float16 before silu's backward, which overflows: x=[[-10., 35000.]],
    dy=[[2.]] gives dgate = -inf for exact -28.61 (and where the exact
    value is 0, NaN: x=[-34304, -34304], dy=2.041).  Compiled, the same
    design is correct (``seed000_silu_and_mul``).  Also -- shared with the
    suite's own eager/compiled silu_and_mul, so an error-model matter, not
    this design's -- for gate < -88.72 sigmoid underflows to 0, so dgate is
    -0 where the exact value is a normal number (x=[[-89., 1000.]], dy=1:
    -0 for -1.96e-34, 15 units, float32 and bfloat16).
    """
    gate, up = x.chunk(2, -1)
    return F.silu(gate) * up


def _seed000_silu_and_mul(x):
    gate, up = x.chunk(2, -1)
    return F.silu(gate) * up


seed000_silu_and_mul = compiled_at_first_call(_seed000_silu_and_mul)
seed000_silu_and_mul.__doc__ = """Seed 000 ``SiluAndMul`` compiled as the seed does -- NOT registered.

Compiled, this design is correct: inductor fuses forward and backward in
float32 and rounds once, so float16's dy * up cannot overflow, and a
case-study run of every property passes it.  (Its only failure is one it
shares with the suite's own eager/compiled silu_and_mul: for gate < -88.72
sigmoid underflows to 0, so dgate is -0 where the exact value is a normal
number: x=[[-89., 1000.]], dy=1 gives -0 for -1.96e-34, 15 units, in
float32/bfloat16 -- the error model's dgate floor, lam_c (1 + |dy up| +
|dy g|), does not cover lam_c |dy up| (1 + |g|).)

It is not in ``IMPLS`` because a case study that passes every core property
fails the session ("expected to fail but passed"); its eager form, which fails float16
gradients, is (``seed000_silu_and_mul_eager``).
"""


# ================================================================ seed 001: tiny-llm (mlx -> torch)
def seed001_rms(x, weight, eps):
    """Seed 001 (tiny-llm week 1 day 4, ``RMSNorm`` in mlx), translated to torch.

    Design: weight held in float32 (``weight.astype(float32)``), x cast to
    float32, ``weight * x * rsqrt(mean(x^2) + eps)`` in float32, one cast
    back to x's dtype at the end.

    What the suite finds: float64 is downcast to float32 (mlx's habit of
    "float32 for accuracy" applied to every input): x=[[0.1]], w=[1.],
    eps=1e-6: 0.99994993 for 0.99995000, 4.3e7 units; float64 gradients
    equally off.  float32, bfloat16, float16 (any weight dtype): correct,
    gradients included (one float32 computation, one rounding).
    """
    orig = x.dtype
    w = weight.to(torch.float32)
    h = x.to(torch.float32)
    return (w * h * torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)).to(orig)


def _silu_no_upcast(t):
    return t / (1 + torch.exp(-t))  # every op rounds to t's dtype


def seed001_swiglu(gate, up):
    """Seed 001 tiny-llm ``silu`` (``x / (1 + exp(-x))``) used in ``Qwen2MLP`` as silu(gate) * up.

    Design: silu evaluated in the input dtype, no upcast; then times up in
    the input dtype.  Four roundings to the output dtype (exp, 1+, /, *).

    What the suite finds:
      * float16: exp(-g) overflows to inf for g <= -11.09375, so silu(g) is
        -0: gate=-11.1015625, up=1000 gives -0 for -0.1675 (1.4e3 ulp,
        2.7 units).  Gradients: dgate NaN (inf * 0 in exp's backward) there,
        gate=-11.1015625, up=1, dy=1: NaN for exact -1.52e-4.
      * bfloat16: four roundings exceed the model's two: gate=0.4375,
        up=1.890625 gives 0.5078125 for 0.50263 (1.33 ulp, 1.32 units);
        gradients are worse where silu' cancels (g near -1.28): gate=-1.28125,
        up=1, dy=1 gives dgate -9.77e-4 for -6.06e-4 (74 units).
      * gradients, every dtype (autograd through g / (1 + exp(-g))): once
        exp(-g) overflows (g < -88.7 float32/bfloat16, g < -709.8 float64)
        dgate is inf/inf = NaN: gate=-100 bf16 / -1000 float64, up=1, dy=1
        gives NaN for exact -3.7e-42 / -0.0; before that, (1 + exp(-g))^2
        overflows in division's backward: gate=-50 float32, up=1, dy=1:
        dgate 71 units (2.8e-4 relative).
      * forward float32 / float64: correct.
    """
    return _silu_no_upcast(gate) * up


# ================================================================ seed 002 / 004: llama-style RMSNorm
def _llama_normalise(h, eps):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def seed002_rms(x, weight, eps):
    """Seed 002 (LLM course lesson 04, ``RMSNorm``): ``_norm(x.float()).type_as(x) * self.weight``.

    What the suite finds:
      * bfloat16/float16 x with a float32 weight (the usual checkpoint
        layout): bf16 * fp32 promotes, so y comes back float32 -- contract:
        wrong output dtype.  x=[[1.]] bf16, w=[1.] fp32 -> float32.
      * bfloat16/float16 with a weight of x's dtype: forward correct (the
        llama order: two roundings), but autograd forms dy * w and
        dy * xhat in the low precision: dweight 1.7 units (2.2 ulp) on a
        4x8 bf16 case, 31 units / 115 ulp on 8x512; dx 1.5 units.
      * float64: ``.float()`` downcasts (x=[[0.1]]: 4.3e7 units).
      * float32: correct.
    """
    return _llama_normalise(x.float(), eps).type_as(x) * weight


def seed004_rms(x, weight, eps):
    """Seed 004 (Add & Norm notes, ``RMSNorm``): ``self.weight * self._norm(h.float()).type_as(h)``.

    Numerically the same design as seed 002 (operands of the final product
    swapped), so the same findings: float32 output for bf16/fp16 x with a
    float32 weight (contract dtype); low-precision dweight/dx in bf16/fp16
    gradients (8x512 bf16: dweight 54 units); float64 computed in float32.
    """
    return weight * _llama_normalise(x.float(), eps).type_as(x)


# ================================================================ seed 004: BatchNorm / LayerNorm / DeepNorm
def _layer_norm_params(x, weight, bias):
    """Weight and bias as an ``nn.LayerNorm`` would hold them: one dtype, losslessly.

    The contract lets weight and bias be x.dtype or float32 independently;
    ``F.layer_norm`` on CPU raises for a weight/bias dtype mismatch and for a
    float64 input with float32 parameters.  Both conversions here are exact
    (float32 holds every bf16/fp16 value, float64 every float32 value), so
    the design's numerics -- x itself stays in its own dtype -- are untouched.
    """
    if x.dtype == torch.float64:
        return weight.to(torch.float64), bias.to(torch.float64)
    if weight.dtype != bias.dtype:
        return weight.float(), bias.float()
    return weight, bias


def seed004_batch_norm(x, weight, bias, eps, mask=None):
    """Seed 004 ``BatchNorm``: mean and biased var over every position, in x's dtype.

    The seed reduces over (B,) or (B, H, W) with channels in dim 1; under the
    contract channels are the last dim, so the statistics are over all leading
    positions.  The seed has no notion of padding: ``mask`` is accepted and
    ignored, exactly the failure the seed's own text warns about.

    What the suite finds:
      * masks (every dtype): padded positions enter the statistics.
        x=[[1.], [5.]], mask=[True, False] (one valid position): y[0] = -1.0
        for exact b = 0 (2.6e4 units); NaN padding poisons the channel.
      * no mask, bfloat16/float16: arithmetic in the input dtype (x - mean,
        the division, the affine all round): 2.3 units; float16 var
        overflows: x=[[-300.], [300.]] -> var = inf -> y = [0, 0] for [-1, 1].
      * float16: an eps below float16's smallest subnormal (6e-8) vanishes in
        var + eps, so a constant channel gives 0/0: x=[1., 2.] (one
        position), eps=1e-12 -> [nan, nan] for the bias.
      * a float32 weight or bias with bf16/fp16 x promotes y to float32
        (contract: dtype), as in seed 002.
      * no mask, float32/float64: correct.
      * gradients bf16/fp16: dx 32 units, dweight 15 units (16x32 bf16).
    """
    c = x.shape[-1]
    flat = x.reshape(-1, c)
    mean = flat.mean(dim=0, keepdim=True)
    var = flat.var(dim=0, keepdim=True, unbiased=False)
    xhat = (flat - mean) / (var + eps).sqrt()
    return (weight * xhat + bias).reshape(x.shape)


def seed004_layer_norm(x, weight, bias, eps):
    """Seed 004 ``LayerNorm``: ``weight * (x - mean) / (std + eps) + bias``, biased std, in x's dtype.

    What the suite finds:
      * eps outside the square root: rho = 1/(std + eps) instead of
        1/sqrt(var + eps).  Rows with std ~ eps are badly wrong:
        x=[[1., 1.001]] f32, eps=1e-5 gives 0.9805 for 0.1562 (1.4e4 units);
        even x=[[-1., 1.]] is off by eps/2 relative: 5e-6, 3.8 units (f32).
        Only exactly constant rows (y = b) come out right.
      * bfloat16/float16: every op rounds in the input dtype (1.2-1.9 units
        on ordinary 8x512 rows); gradients: dweight 13 units (bf16); a
        float32 weight or bias promotes y to float32 (contract: dtype);
        float16 with eps < 6e-8: eps vanishes, a constant row is 0/0 = NaN
        (x=[[3., 3.]], eps=1e-12).
      * gradients float32 at constant rows: d std / dx blows up (x constant,
        eps=1e-12: dx 1.29e11 for 1.29e5).
      * float64: wrong by ~eps/2 relative on every row (2.7e7 units at eps=1e-5).
    """
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True, unbiased=False)
    return weight * (x - mean) / (std + eps) + bias


def seed004_deep_norm(x, sublayer, alpha, weight, bias, eps):
    """Seed 004 ``DeepNorm``: ``LayerNorm(alpha * x + sublayer(x * beta))``.

    The seed scales the *sublayer's input* by beta = (8N)^-1/4; DeepNet's beta
    only scales the sublayer's weight initialisation.  The contract gives
    alpha = (2N)^1/4, so N = alpha^4 / 2 and beta = (4 alpha^4)^-1/4 =
    1/(sqrt(2) alpha).  The norm is nn.LayerNorm, i.e. ``F.layer_norm`` on
    x's dtype (its parameters brought to one dtype losslessly, as a module
    holds them: ``_layer_norm_params``); alpha * x is formed in x's dtype too.

    What the suite finds: the sublayer sees beta * x, so z and y are simply
    wrong in every dtype: x=[[1., 0., 0.]], A=I, c=[0, 1, 2], N=1 (alpha =
    2^1/4, beta = 8^-1/4): y[2] = 0.944 for 0.518 (7e4 units, float32);
    bf16/fp16 off by 30-300 units on 4x32 rows; gradients wrong likewise.
    """
    beta = (4.0 * alpha ** 4) ** -0.25
    z = alpha * x + sublayer(x * beta)
    w, b = _layer_norm_params(x, weight, bias)
    return F.layer_norm(z, (x.shape[-1],), w, b, eps)


# ================================================================ torch's own LayerNorm on low precision
def torch_layer_norm_lowp(x, weight, bias, eps):
    """``F.layer_norm`` called directly on x's dtype (no upcast) -- the common "just use torch" design.

    Forward: correct (CPU computes in float32 internally, one rounding).
    What the suite finds:
      * gradients bfloat16/float16: dweight and dbias are accumulated over
        rows in the low precision (even with a float32 weight, whose grad then
        carries bf16-sized error).  9 rows x 2, dy = 1 in row 0 and 2^-8
        elsewhere (bf16): db = 1.015625 for 1.03125 (2 ulp, 1.9 units);
        8x512 random: db 48 ulp (29 units) bf16, 32 ulp fp16; with a float32
        weight 7.7e3 units.
      * forward, and float32 / float64 gradients: correct.
    Called bare, F.layer_norm would also raise for a float64 x with float32
    parameters, or a weight and bias of different dtypes ("mixed dtype
    (CPU): all inputs must share same datatype"); those are API limits, not
    the design point, so the parameters go through the lossless
    ``_layer_norm_params`` first (x is never converted).
    """
    w, b = _layer_norm_params(x, weight, bias)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


# ================================================================ registry
_STREAM_IN_X_DTYPE = "residual=same"  # nano-vllm's residual = x.to(orig_dtype): a stream in x's dtype, by design


COMPILED_DEVICES = ("cuda",)  # the compiled designs: see the module docstring


def _cs(op, name, fn, reason, **kw):
    return make(op, name, "case-study", fn, expected_failure=reason, **kw)


IMPLS = [
    # seed 000 / 003: in-place RMSNorm (nano-vllm).  Inference-only designs: their backward raises
    # (in-place on a tensor autograd saved), so they are registered without backward.
    _cs("rms_norm", "seed000-rms-inplace", seed000_rms,
        "float32: x.float() is x, so the in-place normalisation overwrites the caller's x (mutation); "
        "float64 computed in float32", target="normcert.impls.case_studies:seed000_rms", backward=False,
        devices=COMPILED_DEVICES),
    _cs("rms_norm", "seed000-rms-inplace-eager", seed000_rms_eager,
        "float32: x.float() is x, so the in-place normalisation overwrites the caller's x (mutation); "
        "float64 computed in float32", backward=False),
    _cs("add_rms_norm", "seed000-add-rms-inplace", seed000_add_rms,
        "float32: add_ writes x+r into the caller's x, and the returned residual aliases y (mutation, "
        "residual_out != x+r); float64 summed and normalised in float32",
        target="normcert.impls.case_studies:seed000_add_rms", backward=False, domain=_STREAM_IN_X_DTYPE,
        devices=COMPILED_DEVICES),
    _cs("add_rms_norm", "seed000-add-rms-inplace-eager", seed000_add_rms_eager,
        "float32: add_ writes x+r into the caller's x, and the returned residual aliases y (mutation, "
        "residual_out != x+r); float64 summed and normalised in float32", backward=False,
        domain=_STREAM_IN_X_DTYPE),
    _cs("add_rms_norm", "seed003-add-rms", seed003_add_rms,
        "float32: residual = s.to(float32) is s, normalised in place, so residual_out is y, not x+r; "
        "float64 summed and normalised in float32", target="normcert.impls.case_studies:seed003_add_rms", backward=False,
        domain=_STREAM_IN_X_DTYPE, devices=COMPILED_DEVICES),
    _cs("add_rms_norm", "seed003-add-rms-eager", seed003_add_rms_eager,
        "float32: residual = s.to(float32) is s, normalised in place, so residual_out is y, not x+r; "
        "float64 summed and normalised in float32", backward=False, domain=_STREAM_IN_X_DTYPE),
    # seed 000 SiluAndMul: compiled it is correct, so only the eager form is a case study (see seed000_silu_and_mul).
    _cs("silu_and_mul", "seed000-silu-and-mul-eager", seed000_silu_and_mul_eager,
        "gradients float16: autograd rounds dy*up to float16, which overflows (dgate -inf for -28.6, NaN for 0)"),
    _cs("rms_norm", "seed001-rms-fp32", seed001_rms,
        "float64 inputs computed in float32 (mlx-style astype(float32)); correct for float32/bf16/fp16"),
    _cs("swiglu", "seed001-swiglu-lowp-silu", seed001_swiglu,
        "silu = g/(1+exp(-g)) in the input dtype: float16 exp overflows for g <= -11.09 (y = -0), bfloat16 "
        "rounds four times (1.3 ulp); its autograd gives NaN dgate once exp(-g) overflows, in every dtype"),
    _cs("rms_norm", "seed002-rms-llama", seed002_rms,
        "bf16/fp16 x with float32 weight returns float32 (dtype); bf16/fp16 gradients formed in low precision; "
        "float64 computed in float32"),
    _cs("rms_norm", "seed004-rms-llama", seed004_rms,
        "bf16/fp16 x with float32 weight returns float32 (dtype); bf16/fp16 gradients formed in low precision; "
        "float64 computed in float32"),
    _cs("batch_norm", "seed004-batch-norm-nomask", seed004_batch_norm,
        "mask ignored: padded positions enter the statistics (one valid position: y != bias; NaN padding poisons); "
        "bf16/fp16 arithmetic in the input dtype (float32 params promote y; fp16 eps vanishes: 0/0)"),
    _cs("layer_norm", "seed004-layer-norm-std-eps", seed004_layer_norm,
        "(x-mean)/(std+eps): eps outside the sqrt, near-constant rows off by orders of magnitude; "
        "bf16/fp16 arithmetic in the input dtype (float32 params promote y; fp16 eps vanishes: 0/0)"),
    _cs("deep_norm", "seed004-deep-norm-beta-input", seed004_deep_norm,
        "feeds beta*x to the sublayer (beta scales DeepNet's weight init, not the input): wrong in every dtype"),
    _cs("layer_norm", "torch-native-layer-norm-lowp", torch_layer_norm_lowp,
        "F.layer_norm on bf16/fp16 CPU accumulates dweight/dbias in the low precision (gradients, 2-50 ulp)"),
]
