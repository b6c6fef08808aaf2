r"""FP4 block quantisation (NVFP4, MXFP4): the formats, how a kernel stores them, and the oracle of an
op whose first output is quantised to them (``rms_norm_fp4_quant``; FlashInfer's ``rmsnorm_fp4quant``,
vLLM's fused NVFP4 quant, TorchAO's NVFP4 tensor).

Per block b of ``block`` consecutive elements of a row, with v = f(args)[0] (the exact real value),
g = global_scale (a positive finite float; the dequantising side's per-tensor scale) and R the block
format's scale rounding:

    A_b  = max_{i in b} |v_i|               (over the non-NaN v_i where the kernel declares
                                            nan=ignore: ``dynamic_quant``'s NaN policy)
    S_b  = A_b / (6 g)                      the exact block scale, before its rounding
    s_b  = R(S_b)                           the stored block scale
    y_i  = E2M1(v_i / (s_b g))  where s_b > 0,   y_i = 0 where s_b = 0
    op(args, block_format, global_scale, layout) = (y packed, s in layout, f's other outputs)

so that y_i s_b g ~ v_i (the consumer dequantises with the same g).

block_format (``BLOCK_FORMATS``):
    "nvfp4"  block 16; R = E4M3 (``formats.E4M3``): nearest even, saturating at 448; a scale
             below half E4M3's least subnormal (2**-10) rounds to 0, and its block is all zeros.
             Stored as torch.float8_e4m3fn.
    "mxfp4"  block 32; R = UE8M0 (``formats.UE8M0``): 2**ceil(log2 S_b), rounded *up* so that the
             block's peak A_b / (s_b g) <= 6 never saturates (as the UE8M0 group quant), clamped to
             [2**-127, 2**127].  Stored as torch.float8_e8m0fnu (one exponent byte).  OCP MX has no
             global scale: a kernel without one is called with global_scale = 1.

E2M1 (``formats.E2M1``): the values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, rounded to nearest, ties to
even (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4), saturating at +-6 (inf included); no NaN, so no
claim is made on y where v is NaN (the block's scale is NaN there, and must be).  A code is 4 bits:
sign (bit 3), exponent (bits 2-1), mantissa (bit 0); codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6.

Packing (``pack_e2m1`` / ``unpack_e2m1``): y is uint8 of shape (..., n / 2); byte j holds element
2j in its low nibble and element 2j + 1 in its high nibble: byte_j = code(y_2j) | code(y_2j+1) << 4.

Scale layout (``layout``, ``BLOCK_LAYOUTS``), with R rows (x.shape[:-1] flattened, row-major) and
G = n / block scales per row:
    "linear"    a contiguous tensor of shape x.shape[:-1] + (G,): scale (r, k) at r G + k.
    "swizzled"  the 128 x 4 tiles the Blackwell tensor cores read (cuBLAS's block-scaling factor
                layout): a contiguous (R', G') tensor, R' = 128 ceil(R / 128), G' = 4 ceil(G / 4),
                whose flat offset of scale (r, k) is

                    off(r, k) = 512 ((r // 128) (G' / 4) + k // 4)        the tile, 512 bytes
                              + 16 (r mod 32) + 4 ((r // 32) mod 4) + k mod 4

                (a tile's 128 rows as 4 groups of 32 interleaved: row r's 4 scales sit beside rows
                r + 32, r + 64, r + 96's).  The padding (rows R..R'-1, columns G..G'-1) is outside
                the contract: neither read nor checked.
``decode_scales`` reads a kernel's scales back to the (..., G) values by this map, ``swizzle`` lays
(..., G) values out by it.

The oracle's outputs (``forward``): v / (D g), D = R(S) where R(S) > 0, else S where S > 0, else 1
(the value before E2M1's rounding; where R(S) = 0 the kernel's y is 0 by the rule above, and the
check rescales to the kernel's own scale, ``bounds_quant.divisor``), and S, each rounded once to
float64.  As for the dynamic quant, the accuracy check divides v by the kernel's own scale
(``bounds_quant.block``): each block scale within its bound of S to the step of its format, each
y_i E2M1(v_i / (s_k g)) to the step.  Those two imply the rest of the contract: |y| <= 6 (E2M1 has
nothing past it), and each block's largest |y| is near the top: where s_k is a normal E4M3 value
and not saturated, A / (s_k g) lies in [6 / (1 + 2**-4), 6 / (1 - 2**-4)] (half a step of 3
mantissa bits either way), past the midpoint 5, so the peak is 6 (4, one step below, only where
the bound lets the kernel's amax sit that much lower); for UE8M0, rounded up, A / (s_k g) lies in
(3, 6], so the peak is 3, 4 or 6: *not* always within one step of 6 (``test_fp4``).
"""
from __future__ import annotations

from dataclasses import dataclass

import mpmath
import numpy as np
import torch

from .dynamic_quant import peak as amax
from .formats import E2M1, E4M3, UE8M0, toward_exact
from .fp4_scales import scale_format

RULES = ("mx_scale", "block_floor")  # the contract choices of a block scale's rounding (``fp4_scales``)
CHOICES = (*RULES, "mx_global_scale", "arithmetic", "intermediate")  # every FP4 contract choice: never passed to the base op
INTERMEDIATES = ("float32", "input")  # where a kernel holds v before its amax (``bounds_quant.block``); the first the default

GLOBAL_SCALES = (1.0, 1.0, 0.375, 2.0 ** -5, 11 / 8192, 3.0)  # drawn (NVFP4): float32-exact, one saturating E4M3
BLOCK_LAYOUTS = ("linear", "swizzled")
TILE_ROWS, TILE_COLS = 128, 4
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; code | 8 is the negative


@dataclass(frozen=True)
class BlockFormat:
    name: str
    block: int
    scale: object  # the scale's Format: rounding and checking
    scale_dtype: torch.dtype  # how a kernel stores it


BLOCK_FORMATS = {"nvfp4": BlockFormat("nvfp4", 16, E4M3, torch.float8_e4m3fn),
                 "mxfp4": BlockFormat("mxfp4", 32, UE8M0, torch.float8_e8m0fnu)}
MAX_BLOCK = max(f.block for f in BLOCK_FORMATS.values())


# ------------------------------------------------------------------ packing
def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 (..., m) -> float32 (..., 2m): element 2j from byte j's low nibble, 2j + 1 from its
    high nibble; a code's top bit is its sign (code 8 is -0)."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=packed.device)
    b = packed.to(torch.int64)
    return torch.stack((table[b & 0xF], table[b >> 4]), dim=-1).flatten(-2)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """The 4-bit code (int64) of each value of y, already an E2M1 value (as float)."""
    a = y.abs()
    codes = torch.zeros(y.shape, dtype=torch.int64, device=y.device)
    for k, value in enumerate(E2M1_VALUES):
        codes = torch.where(a == value, k, codes)
    return codes | torch.where(torch.signbit(y), 8, 0)


def pack_e2m1(y: torch.Tensor) -> torch.Tensor:
    """E2M1 values (..., 2m) -> uint8 (..., m), element 2j in byte j's low nibble."""
    codes = e2m1_codes(y).unflatten(-1, (-1, 2))
    return (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8)


# ------------------------------------------------------------------ scale layouts
def padded(rows: int, groups: int) -> tuple[int, int]:
    """(R', G'): the swizzled layout's shape for R rows of G scales."""
    return -(-rows // TILE_ROWS) * TILE_ROWS, -(-groups // TILE_COLS) * TILE_COLS


def swizzled_offsets(rows: int, groups: int, device="cpu") -> torch.Tensor:
    """off(r, k) (module docstring) for every r < rows, k < groups: an int64 (rows, groups) tensor."""
    _, gp = padded(rows, groups)
    r = torch.arange(rows, device=device)[:, None]
    k = torch.arange(groups, device=device)[None, :]
    return (512 * ((r // TILE_ROWS) * (gp // TILE_COLS) + k // TILE_COLS)
            + 16 * (r % 32) + 4 * ((r // 32) % 4) + k % TILE_COLS)


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """(..., G) scales laid out as the swizzled (R', G') tensor (padding zero)."""
    g = scales.shape[-1]
    flat = scales.reshape(-1, g)
    rp, gp = padded(flat.shape[0], g)
    byte = scales.element_size() == 1  # a float8 scale: moved as its bytes (float8 has no index_put)
    flat = flat.view(torch.uint8) if byte else flat
    out = torch.zeros(rp * gp, dtype=flat.dtype, device=scales.device)
    out[swizzled_offsets(flat.shape[0], g, scales.device).flatten()] = flat.flatten()
    return (out.view(scales.dtype) if byte else out).view(rp, gp)


def decode_scales(raw: torch.Tensor, layout: str, lead: tuple, groups: int) -> torch.Tensor:
    """A kernel's stored scales as float32 values of shape lead + (groups,): read through the
    swizzled index map, or as they are ("linear")."""
    if layout == "swizzled":
        rows = int(np.prod(lead)) if lead else 1
        flat = raw.reshape(-1)
        flat = flat.view(torch.uint8) if raw.element_size() == 1 else flat
        picked = flat[swizzled_offsets(rows, groups, raw.device).flatten()]
        raw = (picked.view(raw.dtype) if raw.element_size() == 1 else picked).reshape(*lead, groups)
    return raw.float()


# ------------------------------------------------------------------ the oracle
def divisor(scale: np.ndarray, form) -> np.ndarray:
    """What the oracle's y was divided by (times g): R(S) where positive, else S where positive,
    else 1 (module docstring); NaN stays NaN."""
    scale = np.asarray(scale, dtype=np.float64)
    r = form.round(scale)
    return np.where(r > 0, r, np.where(scale > 0, scale, np.where(np.isnan(scale), np.nan, 1.0)))


def on_the_exact_side(B, blocks, peak: np.ndarray, scale: np.ndarray, k: float, form) -> np.ndarray:
    """The block scales S = A / k as float64 (``scale``, from the float64 peak A), rounding as the
    exact A / k does under ``form`` (``formats.toward_exact``): the peak read through float64 would
    otherwise round twice and break a tie its own way.  The exact A of a block is the largest exact
    |v| among the elements whose float64 |v| is the float64 peak; on the float64 backend v is its
    own exact value and nothing moves."""
    scale = np.array(scale, dtype=np.float64)
    if getattr(blocks, "dtype", None) != object:
        return scale

    def exact(i):  # only at a tie: the block's exact peak over k
        at_peak = np.nonzero(np.abs(B.to_float64(blocks[i])) == peak[i])[0]
        return max(abs(blocks[i][j]) for j in at_peak) / mpmath.mpf(k)

    return toward_exact(scale, exact, form)


def rounding(args: dict, block_format: str):
    """The rounding R of a block scale in a call on ``args``: its block format's under the declared
    rules (``fp4_scales.scale_format``; the contract choices are None where not declared)."""
    return scale_format(args[block_format], *(args.get(k) for k in RULES))


def forward(base, block_format: str, global_scale: str, layout: str, nan: str):
    """``base(B, **args)`` quantised to FP4 per block (module docstring): (v / (D g), S per block
    (..., n / block), base's other outputs); the layout is the calling contract's, not the values';
    A_b's NaN policy is ``args[nan]``'s (``dynamic_quant.peak``: "ignore" takes it over the block's
    non-NaN elements)."""

    def quantised(B, **args):
        rest = {k: v for k, v in args.items() if k not in (block_format, global_scale, layout, nan, *CHOICES)}
        first, *others = base(B, **rest)
        f, g = BLOCK_FORMATS[args[block_format]], float(args[global_scale])
        form = rounding(args, block_format)
        n = first.shape[-1]
        blocks = first.reshape(first.shape[:-1] + (n // f.block, f.block))
        peak = amax(B, blocks, args[nan])[..., 0]
        with np.errstate(all="ignore"):
            scale = np.asarray(peak, dtype=np.float64) / (6.0 * g)
            scale = on_the_exact_side(B, blocks, peak, scale, 6.0 * g, form)
            d = np.repeat(divisor(scale, form), f.block, axis=-1) * g
        return (first / B.array(d), B.array(scale), *others)

    return quantised


__all__ = ["BLOCK_FORMATS", "BLOCK_LAYOUTS", "E2M1", "GLOBAL_SCALES", "INTERMEDIATES", "decode_scales", "divisor", "forward",
           "pack_e2m1", "padded", "rounding", "swizzle", "swizzled_offsets", "unpack_e2m1"]
