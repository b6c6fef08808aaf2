"""The FP4 block-scale rules as declared contract choices (``oracle.fp4_scales``; ``mx_scale=``,
``block_floor=``, ``nan=unspecified``):

* each MX rule rounds a block's exact scale S = amax / (6 g) to its power of two (the issue's block
  of amax 3.913: 0.5 by OCP's floor, 1 by cuBLAS's rceil), and its rounding interval holds exactly
  the S that round there;
* the NVFP4 floor clamps S to 2**-6 before E4M3, its interval of 2**-6 reaching 0;
* a correct kernel making each choice (``planted.fp4_rules``) is certified once it declares it and
  rejected while it does not; the certificate's domain names the choice;
* where a kernel holds v (``intermediate=``): a float16 v past 65504 is claimed under the default
  (float32) and not under input, and a block whose exact v is infinite is held to the rule's scale.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ....impls.eager import to_e2m1
from ....oracle import OPS
from ....oracle.assessment import assess
from ....oracle.formats import DTYPES, E2M1, E4M3
from ....oracle.fp4_scales import Floored, SharedExponent, scale_format
from ....oracle.lattice import exact_rms_rows, power_of_two
from ...declared.domain import parse
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner
from ...search.strategies import TIE_STEPS, ties_eps, ties_rows

from . import planted
from .expect import registered
from .planted.fp4_rules import _e2m1_half_away as e2m1_half_away, _ieee_formula as _ieee

FP4 = "rms_norm_fp4_quant"  # the op of the planted kernels here
ADD_FP4 = "add_rms_norm_fp4_quant"  # the fused one's

F32 = torch.float32


def test_the_issues_block_is_scaled_by_each_rule():
    s = np.float64(3.913 / 6)
    got = {mode: float(scale_format("mxfp4", mode).round(s)) for mode in ("rceil", "floor", "ceil", "even")}
    assert got == {"rceil": 1.0, "floor": 0.5, "ceil": 1.0, "even": 1.0}
    # a = 6 S just past 1.5 2**k: floor keeps k - 2 (the peak saturates), even too, ceil and rceil go up
    a = 1.6
    got = {mode: float(scale_format("mxfp4", mode).round(np.float64(a / 6))) for mode in ("floor", "ceil", "even")}
    assert got == {"floor": 0.25, "ceil": 0.5, "even": 0.25}
    assert float(SharedExponent(mode="even").round(np.float64(1.75 / 6))) == 0.5  # the significand 1.75 carries


@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_each_mx_rules_interval_holds_the_scales_that_round_to_it(mode):
    form = scale_format("mxfp4", mode)
    rng = np.random.default_rng(0)
    s = np.ldexp(rng.uniform(0.5, 1.0, 2000), rng.integers(-140, 120, 2000))
    q = form.round(s)
    lo, hi = form.rounding_interval(q)
    assert ((lo <= s) & (s <= hi)).all()
    for neighbour in (q / 2, q * 2):  # the next powers of two: no S of q's reaches theirs (but a tie)
        nlo, nhi = form.rounding_interval(neighbour)
        inside = (nlo < s) & (s < nhi)
        assert not inside[(neighbour >= 2.0 ** -127) & (neighbour <= 2.0 ** 127)].any()


def test_the_nvfp4_floor_clamps_before_the_cast():
    form = scale_format("nvfp4", block_floor="2^-6")
    assert isinstance(form, Floored) and scale_format("nvfp4") is E4M3
    assert form.round(np.array([0.0, 1e-4, 2.0 ** -6, 0.1])).tolist() == [2.0 ** -6, 2.0 ** -6, 2.0 ** -6, 0.1015625]
    lo, hi = form.rounding_interval(np.array([2.0 ** -6, 2.0 ** -7, 0.0]))
    assert lo[0] <= 0.0 and hi[0] > 2.0 ** -6  # every S below the floor rounds to it
    assert (lo[1:] > hi[1:]).all()  # and nothing to a smaller value any more


def test_an_mx_kernel_takes_no_global_scale_unless_it_declares_one(tmp_path):
    """MXFP4 cases are drawn with global_scale 1 (OCP MX has none): a kernel that applies the global
    scale to NVFP4 alone is certified; declaring mx_global_scale=taken, it is fitted others, rejected."""
    session = Session(failures_dir=str(tmp_path))
    fn = planted.mx_without_global_scale
    res = runner.run_family(session, BY_NAME["accuracy"], registered(FP4, fn), F32, max_examples=20)
    assert res.outcome == "pass", res.message
    taking = dataclasses.replace(registered(FP4, fn), domain=parse("mx_global_scale=taken"))
    with pytest.raises(PropertyFailure, match=r"accuracy fails"):
        runner.run_family(session, BY_NAME["accuracy"], taking, F32, max_examples=20, shrink=False)


@pytest.mark.parametrize("fn, declared, family", [
    (planted.mx_floor_scale, "mx_scale=floor", "accuracy"),
    (planted.mx_ceil_scale, "mx_scale=ceil", "accuracy"),
    (planted.mx_even_scale, "mx_scale=even", "accuracy"),
    (planted.nvfp4_scale_floored, "block_floor=2^-6", "extremes"),
    (planted.fp4_nan_any_scale, "nan=unspecified", "extremes"),
], ids=["floor", "ceil", "even", "nvfp4_floor", "nan_unspecified"])
def test_a_kernel_is_certified_by_the_scale_rule_it_declares(tmp_path, fn, declared, family):
    session = Session(failures_dir=str(tmp_path))
    impl = registered(FP4, fn)
    assert impl.domain == parse(declared) and declared in impl.domain.describe()
    with pytest.raises(PropertyFailure, match=r"scales"):
        runner.run_family(session, BY_NAME[family], registered(FP4, fn, declared=False), F32, max_examples=20, shrink=False)
    for name in ("accuracy", "extremes"):
        res = runner.run_family(session, BY_NAME[name], impl, F32, max_examples=10)
        assert res.outcome == "pass", (name, res.message)


def test_the_ties_rows_are_exact_in_every_dtype_and_a_moved_one_is_not():
    """``strategies.ties_rows`` with ``ties_eps``: every condition of ``oracle.lattice`` holds in each
    dtype, each block's scale is a power of two and v over it is on E2M1's ties; one value moved by a
    step, another eps or a width that is no power of two and the row is no longer exact."""
    rng = np.random.default_rng(0)
    x = ties_rows(rng, (4, 64))
    eps, ones = ties_eps(x), np.ones(64)
    for dtype in DTYPES:
        ok, v = exact_rms_rows(x, ones, eps, dtype)
        assert ok.all(), dtype
    rho = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    assert (v == x * rho).all()
    blocks = v.reshape(4, 4, 16)
    scale = np.abs(blocks).max(-1, keepdims=True) / 6
    assert power_of_two(scale).all()
    w = np.abs(blocks / scale)
    assert set(np.unique(w)) <= {6.0, *(t / 4 for t in TIE_STEPS)} and np.isin(w, (0.25, 1.25, 2.5, 5.0)).any()
    moved = x.copy()
    moved[0, 1] += 2.0 ** -12
    assert exact_rms_rows(moved, ones, eps, F32)[0][:, 0].tolist() == [False, True, True, True]
    assert not exact_rms_rows(x, ones, 1e-6, F32)[0].any()
    assert not exact_rms_rows(x[:, :48], ones[:48], eps, F32)[0].any()


def test_a_reciprocal_one_ulp_high_returns_the_half_away_bytes():
    """Why the half-away kernel is right under arithmetic=approximate (``oracle.lattice``): on the
    ties rows, nearest-even after a reciprocal of s one ulp high (inside FN_ULPS) gives exactly the
    half-away kernel's values, and these differ from nearest-even after an exact division."""
    rng = np.random.default_rng(1)
    x = torch.from_numpy(ties_rows(rng, (4, 64))).float()
    v = _ieee(x, torch.ones(64), ties_eps(x.double().numpy()))
    blocks = v.unflatten(-1, (4, 16))
    s = blocks.abs().amax(-1, keepdim=True) / 6
    high = torch.nextafter(1 / s, torch.full_like(s, float("inf")))
    assert torch.equal(to_e2m1(blocks * high), e2m1_half_away(blocks / s))
    assert not torch.equal(to_e2m1(blocks / s), e2m1_half_away(blocks / s))


def test_a_bound_of_zero_admits_the_even_end_of_a_tie_alone():
    """``assessment.assess`` (quantised): with a bound of 0 a tie must round to even; with any
    positive bound both ends of its interval pass."""
    e = np.array([0.25, 1.25, 2.5, 5.0, 0.75])
    even, away = torch.tensor([0.0, 1.0, 2.0, 4.0, 1.0]), torch.tensor([0.5, 1.5, 3.0, 6.0, 1.0])
    for bound, away_passes in ((np.zeros(5), False), (np.full(5, 1e-9), True)):
        assert assess("y", even, e, bound, E2M1, quantised=True).ok
        assert assess("y", away, e, bound, E2M1, quantised=True).ok == away_passes


def test_the_half_away_kernel_is_certified_as_approximate_and_rejected_as_ieee(tmp_path):
    """E2M1 half away from zero: certified without a declaration (its bytes are a correct
    approximate kernel's), rejected on a ties bucket once it declares arithmetic=ieee, which the
    certificate's domain names."""
    session = Session(failures_dir=str(tmp_path))
    fn = planted.fp4_ties_half_away
    res = runner.run_family(session, BY_NAME["accuracy"], registered(FP4, fn, declared=False), F32, max_examples=5)
    assert res.outcome == "pass", res.message
    impl = registered(FP4, fn)
    assert impl.domain == parse("arithmetic=ieee") and "arithmetic=ieee" in impl.domain.describe()
    with pytest.raises(PropertyFailure, match=r"(?s)exact (0\.25|1\.25|2\.5|5\.0) \(rounds to [0-9.]+\), "
                                             r"the value rounded is off by [0-9.]+ > bound 0 .*bucket=ties"):
        runner.run_family(session, BY_NAME["accuracy"], impl, F32, max_examples=5, shrink=False)



def test_fusion_makes_no_claim_on_a_block_either_side_makes_none_on(normcert_session, tmp_path):
    """Fused add + FP4 declaring nan=unspecified (issue 55): on a block whose exact v holds a NaN both
    bounds are -inf (no claim) while |exact_F - exact_G| is NaN; the fusion family compares the fused
    kernel with the unfused one where both claim, so the NaN-dropping kernel is certified.  Undeclared
    (nan=propagate: NaN blocks claimed, their scale must be NaN) it is rejected, and so is a kernel
    wrong on the claimed blocks that declares nan=unspecified."""
    session = Session(failures_dir=str(tmp_path), eager=normcert_session.eager)
    fusion, fn = BY_NAME["fusion"], planted.add_fp4_nan_any_scale
    assert registered(ADD_FP4, fn).domain == parse("nan=unspecified")
    res = runner.run_family(session, fusion, registered(ADD_FP4, fn), F32)
    assert res.outcome == "pass", res.message
    wrong = dataclasses.replace(registered(ADD_FP4, planted.add_fp4_scale_before_add), domain=parse("nan=unspecified"))
    for impl, says in ((registered(ADD_FP4, fn, declared=False), r"got [-0-9.e]+, exact nan"), (wrong, "")):
        with pytest.raises(PropertyFailure, match=r"fusion fails .* vs rms_norm_fp4_quant:eager\(residual_out\).*" + says):
            runner.run_family(session, fusion, impl, F32, shrink=False)


SILU_FP4 = "silu_and_mul_fp4_quant"


def _silu_fp4_bounds(x, intermediate, kernel):
    """(exact scales, their bounds, exact y, y's bounds) of silu_and_mul_fp4_quant (MXFP4, g = 1) on x
    against ``kernel``'s own scales."""
    from ....oracle import forward
    args = dict(x=x, block_format="mxfp4", global_scale=1.0, layout="linear", intermediate=intermediate)
    exact = forward(SILU_FP4, **args)
    _, raw = kernel(x, "mxfp4", 1.0, "linear")
    y_bound, scale_bound = OPS[SILU_FP4].forward_bound(args, exact, kernel_scale=raw.float().double().numpy())[:2]
    return exact[1], scale_bound, exact[0], y_bound


def test_a_float16_v_past_65504_is_claimed_unless_v_is_held_in_float16():
    """Block 0's v = silu(1140) 1140 ~ 1.3e6 is past float16's range, not float32's: under the default
    (a fused kernel holds v in float32) its scale is claimed, and the kernel rounding v to float16 first
    (whose amax is then inf: scale 2**127) is off it; declaring intermediate=input, that block has no
    claim and block 1, within range, keeps its bound."""
    x = torch.full((1, 128), 2.0, dtype=torch.float16)
    x[0, 0] = x[0, 64] = 1140.0
    scale, bound, _, _ = _silu_fp4_bounds(x, None, planted.silu_fp4_float16_product)
    assert np.isfinite(bound).all()
    got = planted.silu_fp4_float16_product(x, "mxfp4", 1.0, "linear")[1].float().double().numpy()
    assert got[0, 0] == 2.0 ** 127 and not assess("scales", torch.from_numpy(got), scale, bound, scale_format("mxfp4"),
                                                   quantised=True).ok
    _, bound, _, _ = _silu_fp4_bounds(x, "input", planted.silu_fp4_float16_product)
    assert bound[0, 0] == -np.inf and np.isfinite(bound[0, 1])


def test_a_block_with_an_infinite_v_is_held_to_the_rules_scale():
    """up = inf makes v = inf exactly: the block's exact scale is inf, stored as UE8M0's largest
    (2**127, byte 254) with a finite bound, and the infinite element's y is E2M1(inf) = 6, bound 0;
    the unit-scale kernel's byte 127 is off it, under either intermediate."""
    x = torch.full((1, 128), 2.0)
    x[0, 64] = float("inf")
    for intermediate in (None, "input"):
        scale, bound, y, y_bound = _silu_fp4_bounds(x, intermediate, planted.silu_fp4_float32_product)
        assert scale[0, 0] == np.inf and np.isfinite(bound[0, 0]) and y[0, 0] == np.inf and y_bound[0, 0] == 0.0
        wrong = planted.silu_fp4_inf_peak_unit_scale(x, "mxfp4", 1.0, "linear")[1].float()
        assert wrong[0, 0] == 1.0 and not assess("scales", wrong, scale, bound, scale_format("mxfp4"), quantised=True).ok


@pytest.mark.parametrize("held_dtype", [torch.float16, F32], ids=["float16", "float32"])
def test_where_v_is_held_decides_the_verdict(tmp_path, held_dtype):
    """The float16-rounding kernel: rejected by extremes under the default, certified declaring
    intermediate=input (the certificate's domain names it); the unit-scale kernel rejected under both;
    their twin, v held in the compute format, certified under the default."""
    session = Session(failures_dir=str(tmp_path))
    rounding = registered(SILU_FP4, planted.silu_fp4_float16_product)
    declared = dataclasses.replace(rounding, domain=parse("intermediate=input"))
    assert "intermediate=input" in declared.domain.describe()
    unit = registered(SILU_FP4, planted.silu_fp4_inf_peak_unit_scale)
    rejected = [unit, dataclasses.replace(unit, domain=parse("intermediate=input"))]
    certified = [declared, registered(SILU_FP4, planted.silu_fp4_float32_product)]
    if held_dtype == torch.float16:
        rejected.append(rounding)
    for impl in rejected:
        with pytest.raises(PropertyFailure, match=r"extremes fails .* scales"):
            runner.run_family(session, BY_NAME["extremes"], impl, held_dtype, max_examples=20, shrink=False)
    for impl in certified:
        res = runner.run_family(session, BY_NAME["extremes"], impl, held_dtype, max_examples=20)
        assert res.outcome == "pass", (impl.id, res.message)
