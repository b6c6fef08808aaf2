"""The FP4 block-scale rules as declared contract choices (``oracle.fp4_scales``; ``mx_scale=``,
``block_floor=``, ``nan=unspecified``):

* each MX rule rounds a block's exact scale S = amax / (6 g) to its power of two (the issue's block
  of amax 3.913: 0.5 by OCP's floor, 1 by cuBLAS's rceil), and its rounding interval holds exactly
  the S that round there;
* the NVFP4 floor clamps S to 2**-6 before E4M3, its interval of 2**-6 reaching 0;
* a correct kernel making each choice (``planted.fp4_rules``) is certified once it declares it and
  rejected while it does not; the certificate's domain names the choice.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ....oracle.formats import E4M3
from ....oracle.fp4_scales import Floored, SharedExponent, scale_format
from ...declared.domain import parse
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner

from . import planted
from .expect import registered

FP4 = "rms_norm_fp4_quant"  # the op of the planted kernels here

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
