"""The quantisation rules real libraries ship, as contract choices (issue 47, FP8 / int8 half).

* the amax floor as a declared value: ``amax_floor=1e-10`` (vLLM's ``per_token_group_quant_fp8`` and
  ``_silu_mul_fp8_quant_deep_gemm``, SGLang's ``silu_and_mul_masked_post_quant_fwd``: scale =
  max(amax, 1e-10) / 448) and ``scale_floor=F`` (a number), the named floors still read; the oracle's
  floor is the declared one and the certificate names it;
* planted kernels with vLLM's and SGLang's rule certified under the declaration, rejected without it;
* the group sizes, scale layouts and block formats a kernel supports, as domain keys (``groups=``,
  ``layouts=``, ``block_formats=``): a case is fitted to one of them; DeepGEMM's masked scale layout
  (E, T, G) with strides (T G, 1, T) is ``layouts=mn_major``, drawn only where declared;
* --bitwise determinism compares only the rows an op's contract claims: a masked kernel leaving its
  padding rows as torch.empty leaves them (different bits on each call) is not rejected.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from .... import oracle
from ....impls import UsageError, make
from ....oracle.dynamic_quant import EPS32, MIN_SCALE, floor, read_floor
from ....oracle.formats import bits
from ...declared.domain import DomainError, parse
from ...families import BY_NAME
from ...families.bitwise import claimed
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner
from ...search.case import Case
from ...search.fitting import fit

from . import planted
from .expect import registered

F32 = torch.float32


@pytest.fixture
def session(tmp_path):
    return Session(failures_dir=str(tmp_path))


# ------------------------------------------------------------------ the floor's spellings
def test_the_floor_is_read_in_one_spelling_and_is_the_declared_value():
    assert read_floor("1e-10") == "1e-10" and read_floor("amax:1.0E-10") == "amax:1e-10"
    assert read_floor("eps32") == "eps32" and read_floor("1/512q") == "1/512q"
    for bad in ("0", "-1", "inf", "nan", "amax:", "1e-50", "tiny"):
        with pytest.raises(ValueError, match=r"^expected 1/512q or eps32, a positive number or amax:NUMBER"):
            read_floor(bad)
    a32 = float(np.float32(1e-10))
    assert floor("float8_e4m3fn", "amax:1e-10") == a32 / 448 and floor("int8", "amax:1e-10") == a32 / 127
    assert floor("int8", "0.25") == 0.25 and floor("int8", None) == MIN_SCALE / 127 and floor("int8", "eps32") == EPS32
    assert floor("float8_e4m3fn", "amax:" + repr(1 / 512)) == floor("float8_e4m3fn", "1/512q")  # the default, so stated


def test_the_oracle_floors_an_all_zero_group_at_the_declared_value():
    x = torch.zeros(2, 32, dtype=torch.float64)
    args = {"x": x, "group": 8, "scale_format": "float32", "layout": "row_major"}
    assert (oracle.forward("silu_and_mul_group_quant", **args)[1] == MIN_SCALE / 448).all()
    amax = oracle.forward("silu_and_mul_group_quant", **args, scale_floor="amax:1e-10")[1]
    assert (amax == float(np.float32(1e-10)) / 448).all()
    dq = {"x": torch.zeros(2, 8, dtype=torch.float64), "weight": torch.ones(8, dtype=torch.float64), "eps": 1e-6,
          "qdtype": "int8", "scale_ub": None}
    assert (oracle.forward("rms_norm_dynamic_quant", **dq, scale_floor="0.5")[1] == 0.5).all()
    with pytest.raises(ValueError, match=r"^rms_norm_dynamic_quant: scale_floor must be one of '1/512q', 'eps32', "
                                         r"'amax:A' or 'A' .*got '1e-10x'$"):
        oracle.forward("rms_norm_dynamic_quant", **dq, scale_floor="1e-10x")


def test_the_domain_keys_read_say_back_and_refuse_in_one_line():
    d = parse("amax_floor=1e-10")
    assert d.choices() == {"scale_floor": "amax:1e-10"} and d.describe() == "amax_floor=1e-10"
    assert d.spec() == "amax_floor=1e-10" and parse(d.spec()) == d
    n = parse("scale_floor=2.5e-7")
    assert n.choices() == {"scale_floor": "2.5e-07"} and n.describe() == "scale_floor=2.5e-07" and parse(n.spec()) == n
    assert parse("scale_floor=eps32").scale_floor == "eps32"  # the old spellings
    with pytest.raises(DomainError, match=r"^--domain: amax_floor='eps32': expected a positive number \(e.g. 1e-10\)$"):
        parse("amax_floor=eps32")
    with pytest.raises(DomainError, match=r"^--domain: scale_floor='-1': expected one of 1/512q, eps32 or a positive"):
        parse("scale_floor=-1")
    with pytest.raises(DomainError, match=r"^--domain: scale_floor and amax_floor given together"):
        parse("scale_floor=eps32 amax_floor=1e-10")
    with pytest.raises(UsageError, match=r"domain: amax_floor=1e-10: rms_norm_fp4_quant has no scale_floor choice"):
        make("rms_norm_fp4_quant", "k", "plugin", lambda *a: a, domain="amax_floor=1e-10")


# ------------------------------------------------------------------ the libraries' kernels, planted
@pytest.mark.parametrize("op, fn", [
    ("silu_and_mul_group_quant", planted.sgq_vllm_amax_floor),
    ("silu_and_mul_group_quant_masked", planted.sgqm_sglang_amax_floor),
], ids=["vllm", "sglang_masked"])
def test_the_libraries_amax_floor_is_certified_declared_and_rejected_undeclared(session, op, fn):
    """scale = max(amax, 1e-10) / 448: certified under amax_floor=1e-10; without it, an all-zero
    group's scale 2.2e-13 is not 1 / (512 * 448) and extremes rejects it."""
    with pytest.raises(PropertyFailure, match=r"extremes fails.*scales"):
        runner.run_family(session, BY_NAME["extremes"], registered(op, fn, declared=False), F32, max_examples=10,
                          shrink=False)
    for family in ("extremes", "accuracy"):
        res = runner.run_family(session, BY_NAME[family], registered(op, fn), F32, max_examples=10)
        assert res.outcome == "pass", (family, res.message)


# ------------------------------------------------------------------ groups, layouts, block formats
def test_the_argument_keys_read_fit_and_refuse_in_one_line():
    d = parse("groups=128 layouts=mn_major block_formats=nvfp4")
    assert d.describe() == "group sizes 128; scale layouts mn_major; block formats nvfp4" and parse(d.spec()) == d
    assert (d.allowed("group"), d.allowed("layout"), d.allowed("block_layout")) == ((128,), ("mn_major",), None)
    case = Case("silu_and_mul_group_quant_masked", {"x": torch.randn(2, 3, 256), "counts": torch.tensor([1, 3])},
                {"group": 64, "scale_format": "float32", "layout": "column_major"})
    fitted = fit(case, parse("groups=128 layouts=mn_major"))
    assert (fitted.scalars["group"], fitted.scalars["layout"]) == (128, "mn_major")
    assert fitted.notes["fitted"] == "group -> 128; layout -> mn_major"
    assert fit(case, parse("layouts=row_major,column_major")).scalars["layout"] == "column_major"  # kept
    with pytest.raises(DomainError, match=r"^--domain: groups='48': expected some of 32, 64, 128, comma-separated$"):
        parse("groups=48")
    with pytest.raises(UsageError, match=r"domain: block_formats=nvfp4: silu_and_mul_group_quant takes no such "
                                         r"argument value \(its values: none\)$"):
        make("silu_and_mul_group_quant", "k", "plugin", lambda *a: a, domain="block_formats=nvfp4")


def test_deepgemms_masked_layout_is_certified_declared_and_rejected_undeclared(session):
    """vLLM's DeepGEMM masked kernel writes its scales (E, T, G) with strides (T G, 1, T), which is not
    column_major where E > 1: certified under layouts=mn_major, the contract call rejecting it
    undeclared (asked for row_major / column_major scales)."""
    op, fn = "silu_and_mul_group_quant_masked", planted.sgqm_deepgemm_mn_major
    two = fn(torch.randn(2, 3, 512), torch.tensor([2, 3]), 128, "float32", "mn_major")[1]
    assert two.stride() == (6, 1, 3) and not two.movedim(-1, 0).is_contiguous()
    with pytest.raises(PropertyFailure, match=r"fails.*strides"):
        runner.run_family(session, BY_NAME["accuracy"], registered(op, fn, declared=False), F32, max_examples=10,
                          shrink=False)
    for family in ("accuracy", "extremes"):
        res = runner.run_family(session, BY_NAME[family], registered(op, fn), F32, max_examples=10)
        assert res.outcome == "pass", (family, res.message)


def test_determinism_compares_only_the_rows_the_contract_claims(session):
    """The masked kernel leaves the rows past counts[e] unwritten (random bits on each call): its
    claimed rows are deterministic, and so is its verdict; a row-wise op with no mask compares all."""
    impl = registered("silu_and_mul_group_quant_masked", planted.sgqm_sglang_amax_floor)
    res = runner.run_family(dataclasses.replace(session, bitwise=True), BY_NAME["determinism"], impl, F32,
                            max_examples=10)
    assert res.outcome == "pass", res.message
    valid = torch.tensor([[True, False], [False, False]])
    t = torch.arange(8.0).reshape(2, 2, 2)
    assert claimed(t, valid).tolist() == bits(t[0, 0]).tolist() and claimed(t, None).numel() == 8
    assert claimed(torch.ones(3), valid).numel() == 3  # not of the main tensor's rows: all of it


# ------------------------------------------------------------------ the registry's group kernels: tail=partial
def test_fitting_under_tail_partial_is_idempotent():
    """Batch invariance refits its batches (``bitwise.check_batch_invariance``): a row cut short of a whole
    group once is not cut again (it was, 100 -> 99 -> 98, and the batch's rows did not match the case's)."""
    d = parse("tail=partial")
    for seed in range(8):
        case = Case("rms_norm_group_quant", {"x": torch.randn(3, 128), "weight": torch.ones(128)},
                    {"eps": 1e-6, "group": 32, "scale_format": "float32", "layout": "row_major"},
                    notes={"seed": str(seed)})
        once = fit(case, d)
        assert fit(once, d).main.shape == once.main.shape, seed


@pytest.mark.parametrize("op, target", [
    ("rms_norm_group_quant", "normcert.impls.triton_group_quant:rms_norm_group_quant"),
    ("silu_and_mul_group_quant", "normcert.impls.triton_swiglu_quant:silu_and_mul_group_quant"),
])
def test_the_registry_triton_group_kernels_support_tail_partial(op, target):
    """A row of 100 outputs, groups of 32: four groups, the last of 4 elements with its own scale, as
    the oracle's tail=partial (the kernels declare it): every scale within its error-model bound."""
    pytest.importorskip("triton")
    from ....impls import registry  # noqa: PLC0415
    impl = next(i for i in registry() if i.op == op and i.name == "triton")
    assert impl.domain.tail == "partial" and impl.domain.nan == "propagate"
    compiled = [i for i in registry() if i.op == op and i.name == "compiled"]
    assert all(i.domain.tail == "none" for i in compiled)  # said: whole groups only
    torch.manual_seed(0)
    x = torch.randn(2, 200 if op.startswith("silu") else 100)
    extra = {} if op.startswith("silu") else {"weight": torch.ones(100), "eps": 1e-6}
    args = {"x": x, **extra, "group": 32, "scale_format": "float32", "layout": "row_major"}
    y, scales = impl.fn(**args)
    full = {**args, "tail": "partial", "nan": None, "scale_floor": None}
    exact = oracle.forward(op, **full)
    bound = oracle.OPS[op].forward_bound(full, tuple(exact))[1]  # the error model's, float32 rows
    assert scales.shape == (2, 4) and (np.abs(scales.double().numpy() - exact[1]) <= bound).all()


def test_the_eager_group_kernels_take_a_partial_tail():
    """The eager kernels (the unfused reference of the fusion family) take a row the group does not
    divide and declare it, as the oracle's tail=partial: 100 = 3 x 32 + 4, every scale within its
    bound, y of n."""
    from ....impls import eager, registry  # noqa: PLC0415
    assert all(i.domain.tail == "partial" for i in registry() if i.backend == "eager" and "group_quant" in i.op)
    torch.manual_seed(0)
    args = {"x": torch.randn(2, 100), "weight": torch.ones(100), "eps": 1e-6, "group": 32, "scale_format": "ue8m0",
            "layout": "column_major"}
    y, scales = eager.rms_norm_group_quant(**args)
    full = {**args, "tail": "partial", "nan": None, "scale_floor": None}
    exact = oracle.forward("rms_norm_group_quant", **full)
    bound = oracle.OPS["rms_norm_group_quant"].forward_bound(full, tuple(exact))[1]
    from ....oracle.formats import UE8M0  # noqa: PLC0415
    low, high = UE8M0.round(exact[1] - bound), UE8M0.round(exact[1] + bound)
    got = scales.double().numpy()
    assert y.shape == (2, 100) and scales.shape == (2, 4) and ((low <= got) & (got <= high)).all()
