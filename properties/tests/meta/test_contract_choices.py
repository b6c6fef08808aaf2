"""Contract choices a kernel declares (``properties.declared.domain``: ``nan=``, ``scale_floor=``), judged by its own
declaration.

* the oracle takes the amax under the declared NaN policy: "ignore" drops a NaN (maximumNumber)
  for every op with an amax (per row, per group, per FP4 block), while the NaN elements' own
  outputs stay NaN;
* a correct kernel whose amax drops NaN (as Triton's ``tl.max``) is rejected without ``nan=ignore``
  and certified with it; one that declares it but zeroes the NaN activations is still rejected;
* the scale's floor is the declared one (1 / (512 q) or float32's epsilon): a kernel flooring at
  epsilon is rejected undeclared and certified declared, one declaring it and flooring at 1 / (512 q)
  rejected;
* the tail rule (``tail=partial``): a row of n elements has ceil(n / group) groups, the last of
  n mod group elements scaled by its own amax; undeclared, a row that is not a multiple stays a
  one-line ValueError naming the group; a declaring kernel is fitted rows that are not multiples
  (most cases really have a partial group), a correct one certified on them and the tail's bugs (the
  previous group's scale, the tail's values dropped) rejected, and the same correct kernel
  undeclared is drawn whole groups only;
* each key is read, said back, refused with a one-line error naming it, and refused for an op
  without that choice (an amax, a floored scale, groups).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from .... import oracle
from ....impls import UsageError, make
from ...declared.domain import CONTRACT, Domain, DomainError, parse
from ....oracle.dynamic_quant import EPS32, MIN_SCALE
from ...run import runner
from ...search.case import Case
from ...families import BY_NAME
from ...search.fitting import PARTIAL_EVERY, fit
from ...harness.measure import PropertyFailure, Worst
from ...harness.session import Session

from . import planted
from .expect import registered

DYNAMIC, GROUP = "rms_norm_dynamic_quant", "rms_norm_group_quant"  # the ops of most planted kernels here

F32 = torch.float32


@pytest.fixture
def session(tmp_path):
    return Session(failures_dir=str(tmp_path))


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
@pytest.mark.parametrize("key, value, bad, expected, op, first", [
    ("nan", "ignore", "drop", "propagate, ignore, unspecified", "rms_norm", "rms_norm_dynamic_quant"),
    ("scale_floor", "eps32", "eps", "1/512q, eps32 or a positive number (e.g. 1e-10)", "rms_norm_fp4_quant",
     "rms_norm_dynamic_quant"),
    ("tail", "partial", "full", "none, partial", "rms_norm_dynamic_quant", "rms_norm_group_quant"),
    ("mx_scale", "floor", "round", "rceil, floor, ceil, even", "rms_norm_group_quant", "rms_norm_fp4_quant"),
    ("block_floor", "2^-6", "tiny", "none, 2^-6", "rms_norm_dynamic_quant", "rms_norm_fp4_quant"),
    ("intermediate", "input", "float16", "float32, input", "silu_and_mul_group_quant", "rms_norm_fp4_quant"),
])
def test_a_contract_key_is_read_said_back_and_refused_in_one_line(key, value, bad, expected, op, first):
    """Read and said back; an unknown value names the key and its values; declared for an op
    without that choice (rms_norm takes no amax, FP4's block scale has no floor, a per-token quant
    has no groups), a usage error."""
    d = parse(f"{key}={value}")
    assert getattr(d, key) == value and parse(d.spec()) == d
    assert d.describe() == f"{key}={value}"
    with pytest.raises(DomainError, match=rf"^--domain: {key}='{bad}': expected one of {re.escape(expected)}$"):
        parse(f"{key}={bad}")
    with pytest.raises(UsageError, match=rf"^'k': domain: {key}={re.escape(value)}: {op} has no {key} choice to "
                                         rf"declare \(the ops that have one: {first}, .*\)$"):
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
        runner.run_family(session, BY_NAME["extremes"], registered(DYNAMIC, right, declared=False), F32, max_examples=10,
                          shrink=False)
    for family in ("extremes", "accuracy"):
        res = runner.run_family(session, BY_NAME[family], registered(DYNAMIC, right), F32, max_examples=10)
        assert res.outcome == "pass", (family, res.message)
    # the declared choice done otherwise, on a case that shows it: a NaN and a float8 qdtype for the
    # NaN policy (int8 has no NaN), an all-zero row for the floor (that the search finds them is
    # test_meta's claim, on every seed)
    x = torch.linspace(-2, 2, 32, dtype=wrong_dtype).reshape(2, 16)
    x[0, 3] = float("nan") if right is planted.dq_nan_ignored else 0.0
    if right is not planted.dq_nan_ignored:
        x[1] = 0.0
    case = fit(Case("rms_norm_dynamic_quant", {"x": x, "weight": torch.ones(16, dtype=wrong_dtype)},
                    {"eps": 1e-6, "qdtype": "float8_e4m3fn", "scale_ub": None}), registered(DYNAMIC, wrong).domain)
    with pytest.raises(PropertyFailure):
        BY_NAME["extremes"].check(session, registered(DYNAMIC, wrong), case, Worst())


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


# ------------------------------------------------------------------ tail=partial
def _group_args(n, group=32, **extra):
    torch.manual_seed(0)
    return {"x": torch.randn(2, n, dtype=torch.float64), "weight": torch.ones(n, dtype=torch.float64), "eps": 1e-6,
            "group": group, "scale_format": "float32", "layout": "row_major", **extra}


def test_tail_partial_gives_the_last_group_its_own_scale():
    """100 = 3 x 32 + 4: four groups, the last of 4 elements scaled by their own amax; the scales are
    (rows, ceil(n / group)) in either layout; undeclared, the same row is a one-line ValueError naming
    the group, and a [gate | up] op's groups are of its output row."""
    args = _group_args(100)
    with pytest.raises(ValueError, match=r"^rms_norm_group_quant: group must be a divisor of the row length 100, got "
                                         r"32$"):
        oracle.forward("rms_norm_group_quant", **args)
    y, scales = oracle.forward("rms_norm_group_quant", **args, tail="partial")
    (v,) = oracle.forward("rms_norm", x=args["x"], weight=args["weight"], eps=args["eps"])
    peaks = [np.abs(v[:, j * 32:(j + 1) * 32]).max(-1) for j in range(4)]
    assert scales.shape == (2, 4) and (scales == np.stack(peaks, -1) / 448).all()
    assert (y == v / np.repeat(scales, 32, -1)[:, :100]).all()
    rec = oracle.OPS["rms_norm_group_quant"]
    for layout in ("row_major", "column_major"):
        assert rec.out_shapes((2, 100), {**args, "layout": layout, "tail": "partial"})[1] == (2, 4)
    x = torch.randn(3, 2 * 70, dtype=torch.float64)
    _, scales = oracle.forward("silu_and_mul_group_quant", x=x, group=64, scale_format="ue8m0", layout="column_major",
                               tail="partial")
    assert scales.shape == (3, 2)  # 70 = 64 + 6 outputs a row
    same = oracle.forward("rms_norm_group_quant", **_group_args(128), tail="partial")[1]
    assert (same == oracle.forward("rms_norm_group_quant", **_group_args(128))[1]).all()  # whole groups: unchanged


def test_tail_partial_bounds_each_group_over_its_own_elements():
    """The scale's bound of the partial group is the per-group formula over its 4 elements: the
    bounds of a row of 100 are those of its first 96 (whole groups) and of its own tail."""
    args = {**_group_args(100), "tail": "partial", "nan": None, "scale_floor": None}
    args["x"], args["weight"] = args["x"].float(), args["weight"].float()
    rec = oracle.OPS["rms_norm_group_quant"]
    exact = oracle.forward("rms_norm_group_quant", **args)
    y_bound, s_bound = rec.forward_bound(args, tuple(exact))[:2]
    assert s_bound.shape == (2, 4) and np.isfinite(s_bound).all() and (s_bound > 0).all()
    assert y_bound.shape == (2, 100) and np.isfinite(y_bound).all()


def test_tail_partial_fits_rows_that_are_not_multiples():
    """Declared, the op's group multiple is not forced (``Domain.width``) and three drawn cases in four
    are cut short of a whole group, by 1 to group - 1 elements of the output row; undeclared, every
    fitted row stays a multiple of the group."""
    partial = parse("tail=partial")
    assert partial.width(100, op_multiple=128) == 100 and Domain().width(100, op_multiple=128) == 128
    assert parse("tail=partial width_multiple=8").width(100, halves=True, op_multiple=128) == 104
    tails = []
    seeds = range(0, 100, 7)
    for seed in seeds:
        for op in ("rms_norm_group_quant", "silu_and_mul_group_quant"):
            case = Case.sample(op, F32, width=256)
            case.notes["seed"] = str(seed)
            fitted = fit(case, partial)
            rows = case.record.out_shape
            m0, m, group = rows(tuple(case.tensors["x"].shape))[-1], rows(tuple(fitted.tensors["x"].shape))[-1], \
                fitted.scalars["group"]
            assert fitted.scalars["tail"] == "partial" and m0 % group == 0 and m0 - group < m <= m0
            tails.append(m % group)
            assert fit(case, parse("nan=ignore")).tensors["x"].shape == case.tensors["x"].shape
    whole = sum(seed % PARTIAL_EVERY == 0 for seed in seeds)  # the seeds that keep whole groups
    assert tails.count(0) == 2 * whole and 0 < whole < len(seeds) / 2 and len(set(tails)) > 5


@pytest.mark.parametrize("fn, op", [(planted.gq_tail_partial, "rms_norm_group_quant"),
                                    pytest.param(planted.sgq_tail_partial, "silu_and_mul_group_quant",
                                                 marks=pytest.mark.normcert_heavy)])  # test_meta certifies it too
def test_a_kernel_declaring_tail_partial_is_certified_on_partial_groups(session, fn, op):
    """A correct kernel with a partial last group of its own scale, declared: certified by accuracy and
    extremes in float32 and bfloat16 on rows that are not multiples of the group; undeclared, drawn
    whole groups only, and certified so."""
    impl = registered(op, fn)
    assert impl.domain.describe() == "tail=partial"
    for family in ("accuracy", "extremes"):
        for dtype in (F32, torch.bfloat16):
            res = runner.run_family(session, BY_NAME[family], impl, dtype, max_examples=3)
            assert res.outcome == "pass", (family, dtype, res.message)
    res = runner.run_family(session, BY_NAME["accuracy"], registered(op, fn, declared=False), F32, max_examples=3)
    assert res.outcome == "pass", res.message


@pytest.mark.parametrize("wrong, shown", [
    (planted.gq_tail_scale_of_previous_group, r"scales\[3\]"),
    (planted.gq_tail_values_dropped, r"y\[\d+\]: got 0.0"),
], ids=["previous_scale", "values_dropped"])
def test_a_kernel_that_handles_the_tail_wrongly_is_rejected(session, wrong, shown):
    """Declared tail=partial, the partial group's scale taken from the whole group before it, or its
    values dropped (padded with zeros, the amax over the pad right): rejected on the partial groups;
    undeclared, never drawn one, both pass (the bugs live in the tail alone)."""
    with pytest.raises(PropertyFailure, match=rf"accuracy fails.*{shown}"):
        runner.run_family(session, BY_NAME["accuracy"], registered(GROUP, wrong), F32, max_examples=10, shrink=False)
    res = runner.run_family(session, BY_NAME["accuracy"], registered(GROUP, wrong, declared=False), F32, max_examples=5)
    assert res.outcome == "pass", res.message


def test_a_domain_says_every_contract_choice_it_declares():
    every = Domain(**{key: values[-1] for key, values in CONTRACT.items()})
    assert every.choices() == {key: values[-1] for key, values in CONTRACT.items()} and not Domain().choices()
