"""Contract choices a kernel declares (``impls.domain``: ``nan=``, ``scale_floor=``), judged by its own
declaration.

* the oracle takes the amax under the declared NaN policy: "ignore" drops a NaN (maximumNumber)
  for every op with an amax (per row, per group, per FP4 block), while the NaN elements' own
  outputs stay NaN;
* a correct kernel whose amax drops NaN (as Triton's ``tl.max``) is rejected without ``nan=ignore``
  and certified with it; one that declares it but zeroes the NaN activations is still rejected;
* the scale's floor is the declared one (1 / (512 q) or float32's epsilon): a kernel flooring at
  epsilon is rejected undeclared and certified declared, one declaring it and flooring at 1 / (512 q)
  rejected;
* each key is read, said back, refused with a one-line error naming it, and refused for an op
  without an amax.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from ... import oracle
from ...impls import UsageError, make
from ...impls.domain import Domain, DomainError, parse
from ...oracle.dynamic_quant import EPS32, MIN_SCALE
from .. import runner
from ..case import Case
from ..families import BY_NAME
from ..fitting import fit
from ..measure import PropertyFailure
from ..session import Session

from . import planted

F32 = torch.float32


@pytest.fixture
def session(tmp_path):
    return Session(failures_dir=str(tmp_path))


def _impl(fn, declared=True):
    """The planted kernel as registered: with its declared domain, or (``declared=False``) without."""
    impl = make("rms_norm_dynamic_quant", fn.__name__, "plugin", fn, target=f"normcert.properties.meta.planted:{fn.__name__}")
    return impl if declared else dataclasses.replace(impl, domain=Domain())


# ------------------------------------------------------------------ the oracle
def test_nan_ignore_takes_the_amax_over_the_rest_and_keeps_nan_outputs():
    x = torch.tensor([[1.0, float("nan"), -3.0, 2.0], [float("nan")] * 4], dtype=torch.float64)
    args = {"x": x, "qdtype": "float8_e4m3fn", "scale_ub": None}
    y, scale = oracle.forward("silu_and_mul_dynamic_quant", **args)
    assert np.isnan(scale).all()
    y, scale = oracle.forward("silu_and_mul_dynamic_quant", **args, nan="ignore")
    (v,) = oracle.forward("silu_and_mul", x=x)
    assert scale[0] == abs(v[0, 0]) / 448 and scale[1] == MIN_SCALE / 448  # a row all NaN: the floor
    assert np.isnan(y[0, 1]) and np.isnan(y[1]).all() and y[0, 0] == v[0, 0] / scale[0]


@pytest.mark.parametrize("op, extra", [
    ("rms_norm_group_quant", {"weight": torch.ones(64, dtype=torch.float64), "eps": 1e-6, "group": 32,
                              "scale_format": "float32", "layout": "row_major"}),
    ("silu_and_mul_fp4_quant", {"block_format": "nvfp4", "global_scale": 1.0, "layout": "linear"}),
])
def test_nan_ignore_reaches_every_amax(op, extra):
    """A group's and an FP4 block's amax: the NaN's group is scaled by its other elements."""
    torch.manual_seed(0)
    x = torch.randn(1, 64 if op.startswith("rms") else 128, dtype=torch.float64)
    x[0, 3] = float("nan")
    _, propagated = oracle.forward(op, x=x, **extra)
    y, ignored = oracle.forward(op, x=x, **extra, nan="ignore")
    nan_first = np.isnan(propagated[0, 0])
    if op.startswith("rms"):  # a NaN in x: the whole row's v is NaN, every group's amax the floor's
        assert nan_first and np.isnan(propagated).all() and (ignored == MIN_SCALE / 448).all()
    else:  # silu_and_mul: the NaN gate element alone
        assert nan_first and not np.isnan(propagated[0, 1:]).any() and math.isfinite(ignored[0, 0])
        assert np.isnan(y[0, 3]) and not np.isnan(np.delete(y[0], 3)).any()


# ------------------------------------------------------------------ the domain key
@pytest.mark.parametrize("key, value, bad, expected, op", [
    ("nan", "ignore", "drop", "propagate, ignore", "rms_norm"),
    ("scale_floor", "eps32", "eps", "1/512q, eps32", "rms_norm_fp4_quant"),
])
def test_a_contract_key_is_read_said_back_and_refused_in_one_line(key, value, bad, expected, op):
    """Read and said back; an unknown value names the key and its values; declared for an op
    without that choice (rms_norm takes no amax, FP4's block scale has no floor), a usage error."""
    d = parse(f"{key}={value}")
    assert (d.nan, d.scale_floor)[key == "scale_floor"] == value and parse(d.spec()) == d
    assert d.describe() == f"{key}={value}"
    with pytest.raises(DomainError, match=rf"^--domain: {key}='{bad}': expected one of {expected}$"):
        parse(f"{key}={bad}")
    with pytest.raises(UsageError, match=rf"^'k': domain: {key}={value}: {op} has no {key} choice to declare \(the "
                                         r"ops that have one: rms_norm_dynamic_quant, .*\)$"):
        make(op, "k", "plugin", lambda *a: a, domain=f"{key}={value}")


def test_a_drawn_case_holds_the_default_and_fitting_sets_the_declared_choice():
    d = parse("nan=ignore")
    case = Case.sample("rms_norm_dynamic_quant", F32)
    assert case.scalars["nan"] is None  # drawn as the default
    fitted = fit(case, d)
    assert fitted.scalars["nan"] == "ignore" and fitted.notes["fitted"] == "nan -> ignore"


# ------------------------------------------------------------------ verdicts
@pytest.mark.parametrize("right, wrong, wrong_dtype", [
    (planted.dq_nan_ignored, planted.dq_nan_ignored_nan_zeroed, torch.bfloat16),
    (planted.dq_eps32_floor, planted.dq_floor_not_as_declared, F32),
], ids=["nan", "scale_floor"])
def test_a_kernel_is_judged_by_the_contract_choice_it_declares(session, right, wrong, wrong_dtype):
    """A correct kernel that makes a documented choice (an amax that drops NaN, as the held-out Triton
    per-token kernel whose extremes failed with ``scales[0]: got 4.36e-06, exact nan``; float32's
    epsilon as the floor) is rejected while it does not declare it and certified once it does; a
    kernel that declares the choice and does otherwise is still rejected."""
    with pytest.raises(PropertyFailure, match=r"extremes fails.*scales"):
        runner.run_family(session, BY_NAME["extremes"], _impl(right, declared=False), F32, max_examples=10,
                          shrink=False)
    for family in ("extremes", "accuracy"):
        res = runner.run_family(session, BY_NAME[family], _impl(right), F32, max_examples=10)
        assert res.outcome == "pass", (family, res.message)
    with pytest.raises(PropertyFailure, match="extremes fails"):
        runner.run_family(session, BY_NAME["extremes"], _impl(wrong), wrong_dtype, max_examples=20, shrink=False)


def test_the_scale_floor_is_the_declared_one():
    x = torch.zeros(2, 8, dtype=torch.float64)
    args = {"x": x, "weight": torch.ones(8, dtype=torch.float64), "eps": 1e-6, "qdtype": "int8", "scale_ub": None}
    assert (oracle.forward("rms_norm_dynamic_quant", **args)[1] == MIN_SCALE / 127).all()
    assert (oracle.forward("rms_norm_dynamic_quant", **args, scale_floor="1/512q")[1] == MIN_SCALE / 127).all()
    eps32 = oracle.forward("rms_norm_dynamic_quant", **args, scale_floor="eps32")[1]
    assert EPS32 == 2.0 ** -23 and (eps32 == EPS32).all()
    group = {"x": torch.zeros(2, 16, dtype=torch.float64), "group": 8, "scale_format": "ue8m0", "layout": "row_major",
             "scale_floor": "eps32"}
    assert (oracle.forward("silu_and_mul_group_quant", **group)[1] == EPS32).all()  # 2**-23: UE8M0 keeps it
