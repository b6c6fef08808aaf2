"""The FP4 formats and storage (``oracle.fp4``) checked against their definitions, independently of
the kernels: E2M1's values and ties, the nibble order, the swizzled index map against cuBLAS's
documented offsets, the oracle against the definition, and bad input named from the oracle and
from normcert's kernels."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from ... import oracle
from ...impls import eager
from ...oracle import fp4
from ...oracle.formats import E2M1, E4M3, UE8M0

OP = "rms_norm_fp4_quant"


def test_e2m1_values_ties_and_saturation():
    """Values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; ties to the even code; past 6 (inf included) 6."""
    v = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7.0, np.inf, -0.25, -5.0, -100.0])
    assert E2M1.round(v).tolist() == [0, 1, 1, 2, 2, 4, 4, 6, 6, 6, -0.0, -4, -6]
    grid = np.array(fp4.E2M1_VALUES)
    assert (E2M1.round(grid) == grid).all() and E2M1.max == 6.0
    w = torch.tensor(v, dtype=torch.float32)
    assert eager.to_e2m1(w).tolist() == E2M1.round(v).tolist()  # the kernel's rounding is the format's


def test_nibble_order_is_element_2j_low():
    """Byte j = code(y_2j) | code(y_2j+1) << 4, a code's top bit its sign: 1.0 is code 2, -0.5 is
    code 9, so [1.0, -0.5] is 0x92; every byte reads back to itself through both packers."""
    assert fp4.pack_e2m1(torch.tensor([1.0, -0.5])).tolist() == [0x92]
    assert eager.pack_fp4(torch.tensor([1.0, -0.5])).tolist() == [0x92]
    assert fp4.unpack_e2m1(torch.tensor([0x92], dtype=torch.uint8)).tolist() == [1.0, -0.5]
    every = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    values = fp4.unpack_e2m1(every)
    assert torch.equal(fp4.pack_e2m1(values), every) and torch.equal(eager.pack_fp4(values), every)
    assert values[::2].tolist()[:8] == list(fp4.E2M1_VALUES)  # low nibbles of bytes 0..7


def test_swizzled_offsets_are_cublas_documented_ones():
    """cuBLAS's (nvmath's ``get_block_scale_offset``) examples for an NVFP4 operand of 128 x 128
    (8 blocks a row): block (5, 2) at 82, (5, 5) at 593; and the map is a bijection onto the tiles
    with the padding left over."""
    off = fp4.swizzled_offsets(128, 8)
    assert int(off[5, 2]) == 82 and int(off[5, 5]) == 593
    for rows, groups in ((1, 1), (130, 6), (256, 8), (3, 2)):
        rp, gp = fp4.padded(rows, groups)
        o = fp4.swizzled_offsets(rows, groups).flatten()
        assert len(set(o.tolist())) == rows * groups and int(o.max()) < rp * gp
        if rows % 128 == 0 and groups % 4 == 0:
            assert sorted(o.tolist()) == list(range(rp * gp))
    s = torch.arange(130 * 6, dtype=torch.float32).reshape(130, 6)
    for dtype in (torch.float32, torch.float8_e4m3fn):
        stored = (s / 64).to(dtype)
        back = fp4.decode_scales(fp4.swizzle(stored), "swizzled", (130,), 6)
        assert torch.equal(back, stored.float())


@pytest.mark.parametrize("block_format", list(fp4.BLOCK_FORMATS))
@pytest.mark.parametrize("g", [1.0, 0.375, 3.0])
def test_oracle_is_the_definition(block_format, g):
    """y's rounding E2M1(v / (R(S) g)) and S = amax / (6 g) per block, from v = rms_norm's exact
    output (the oracle composes the base op's); zero where R(S) = 0."""
    rec = oracle.OPS[OP]
    args = rec.sample(torch.float64, rows=4, width=64, seed=3)
    args.update(block_format=block_format, global_scale=g)
    y, scale = oracle.forward(OP, **args)
    v = oracle.forward("rms_norm", x=args["x"], weight=args["weight"], eps=args["eps"])[0]
    f = fp4.BLOCK_FORMATS[block_format]
    blocks = v.reshape(4, -1, f.block)
    np.testing.assert_allclose(scale, np.abs(blocks).max(-1) / (6 * g), rtol=1e-15)
    s = f.scale.round(scale)
    want = np.where(s[..., None] > 0, E2M1.round(blocks / (s[..., None] * g)), 0.0).reshape(4, -1)
    got = np.where(np.repeat(s, f.block, -1) > 0, E2M1.round(y), 0.0)
    assert (got == want).all()


def _triton_kernel():
    pytest.importorskip("triton")
    from ...impls import triton_fp4  # noqa: PLC0415 - imports triton (the plugin has set the interpreter)

    return triton_fp4.rms_norm_fp4_quant


@pytest.mark.parametrize("kernel", ["eager", "triton"])
@pytest.mark.parametrize("block_format", list(fp4.BLOCK_FORMATS))
@pytest.mark.parametrize("layout", list(fp4.BLOCK_LAYOUTS))
def test_each_blocks_peak_is_six_or_one_step_below(block_format, layout, kernel):
    """The corollary the docstring states: with the kernel's own scale normal, a block's largest |y|
    is 6 or 4 for NVFP4 (the scale's rounding moves the peak by at most 1/16), one of 3, 4, 6 for
    MXFP4 (rounding up to a power of two leaves the peak in (3, 6]); none past 6.  Of the eager
    kernel and of the Triton one (its bytes and scales as the interpreter stores them)."""
    rec = oracle.OPS[OP]
    args = rec.sample(torch.float32, rows=200, width=256, seed=1)
    args.update(block_format=block_format, layout=layout, global_scale=0.375)
    fn = eager.rms_norm_fp4_quant if kernel == "eager" else _triton_kernel()
    y, s = rec.decode(rec.call_outputs(fn, args), args)
    block = fp4.BLOCK_FORMATS[block_format].block
    peak = y.abs().unflatten(-1, (-1, block)).amax(-1)
    normal = s >= 2.0 ** -6
    allowed = {4.0, 6.0} if block_format == "nvfp4" else {3.0, 4.0, 6.0}
    assert normal.all() and set(peak[normal].unique().tolist()) <= allowed and float(y.abs().max()) <= 6.0


def test_a_scale_that_rounds_to_zero_gives_zeros_and_is_checked_so():
    """A block whose S is below half E4M3's least subnormal: its scale 0 and its values 0; the
    accuracy check holds a kernel's y there to 0 exactly (bound 0)."""
    rec = oracle.OPS[OP]
    x = torch.full((1, 32), 1.0)
    args = dict(x=x, weight=torch.cat([torch.full((16,), 1e-4), torch.ones(16)]), eps=1e-5,
                block_format="nvfp4", global_scale=1.0, layout="linear")
    y, s = rec.decode(rec.call_outputs(eager.rms_norm_fp4_quant, args), args)
    assert float(s[0, 0]) == 0.0 and (y[0, :16] == 0).all()
    exact = oracle.forward(OP, **args)
    bounds = rec.forward_bound(args, exact, kernel_scale=s.double().numpy())
    assert (bounds[0][0, :16] == 0).all()


@pytest.mark.parametrize("change, message", [
    (dict(block_format="nvfp8"), "block_format must be one of 'nvfp4', 'mxfp4', got 'nvfp8'"),
    (dict(layout="row_major"), "layout must be one of 'linear', 'swizzled', got 'row_major'"),
    (dict(global_scale=0.0), "global_scale must be a positive finite float, got 0.0"),
    (dict(global_scale=-1.0), "global_scale must be a positive finite float, got -1.0"),
    (dict(global_scale=math.inf), "global_scale must be a positive finite float, got inf"),
    (dict(global_scale=math.nan), "global_scale must be a positive finite float, got nan"),
    (dict(x=torch.ones(2, 48), block_format="mxfp4"),
     "block_format must be a format whose block divides the row length 48, got 'mxfp4' (block 32)"),
])
def test_fp4_bad_input_is_a_clear_value_error(change, message):
    """From the oracle and from each of normcert's own kernels of the op."""
    args = {**dict(x=torch.ones(2, 64), weight=torch.ones(64), eps=1e-5, block_format="nvfp4", global_scale=1.0,
                   layout="linear"), **change}
    args["weight"] = torch.ones(args["x"].shape[-1])
    with pytest.raises(ValueError, match=f"^{OP}: {re.escape(message)}"):
        oracle.forward(OP, **args)
    from ...impls import registry
    for impl in (i for i in registry() if i.op == OP and i.backend in ("eager", "triton")):
        with pytest.raises(ValueError, match=f"^{OP}: {re.escape(message)}"):
            oracle.OPS[OP].call(impl.fn, args)


def test_scale_formats_are_what_the_kernels_store():
    """NVFP4's scales are float8_e4m3fn (checked in E4M3), MXFP4's float8_e8m0fnu (UE8M0)."""
    assert fp4.BLOCK_FORMATS["nvfp4"].scale is E4M3 and fp4.BLOCK_FORMATS["mxfp4"].scale is UE8M0
    rec = oracle.OPS[OP]
    for f, dtype in (("nvfp4", torch.float8_e4m3fn), ("mxfp4", torch.float8_e8m0fnu)):
        assert rec.out_dtype("scales", {"block_format": f}) == dtype
    assert rec.out_format("y", {}) is E2M1


@pytest.mark.parametrize("path", ["float64", "mpmath"])
def test_a_block_scale_just_below_an_e4m3_midpoint_is_rounded_as_the_exact_value_is(path):
    """A constant row of 2768240640 (bfloat16) plus a float32 residual of -6.55e-4 normalises to
    z rho = (1 + eps / z^2)^(-1/2) = 1 - 1.4e-22, so a block whose weight peaks at -3.796875 has,
    with g = 3, the exact scale S = 0.2109375 (1 - 1.4e-22): just below the E4M3 midpoint between
    0.203125 and 0.21875.  Read through float64 the peak is 3.796875 and S the midpoint itself,
    which ties to even, 0.21875: the oracle then claimed the wrong scale, and on a row resolved
    on mpmath its values and its scale came from two paths (a correct kernel failed, found by the
    search).  Both paths must round S down, and divide the row's values by that scale."""
    w = torch.tensor([0.83984375, -0.234375, -2.375, 0.1328125, -0.203125, -0.1669921875, -1.40625, -3.28125,
                      0.1591796875, -1.203125, -1.171875, 0.154296875, 1.609375, -3.796875, 0.3671875,
                      -0.490234375], dtype=torch.bfloat16)
    y, scale, _ = oracle.forward("add_rms_norm_fp4_quant", path=path,
                                 x=torch.full((1, 16), 2768240640.0, dtype=torch.bfloat16),
                                 residual=torch.full((1, 16), -0.0006550790858455002), weight=w,
                                 eps=0.0021890011042411304, block_format="nvfp4", global_scale=3.0, layout="linear")
    assert scale[0, 0] < 0.2109375 and E4M3.round(scale[0, 0]) == 0.203125
    assert y[0, 11] == pytest.approx(0.154296875 / (0.203125 * 3), rel=1e-15)  # rounds to 0.5, as the kernel's does
