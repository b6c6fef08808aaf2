"""The records agree with the code that uses them.

* every op record: its sample input passes its own validation and the oracle
  runs on it, forward and VJP, with outputs of the shapes ``value_shapes`` says;
  every registry kernel of the op accepts it, returning the shapes ``out_shapes`` says (its
  storage: packed FP4, padded swizzled scales) that ``decode`` reads back as ``value_shapes``;
* every property family: exactly one test runs it (its ``normcert_family`` mark);
  every property test (a test taking ``impl``) in the suite belongs to a family,
  so no test escapes ``applies`` and the certificate; each of its buckets draws
  the bucket's shape, spun differently per seed.
"""
from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st

from ... import impls, oracle
from .. import suite
from ..families import BY_NAME, FAMILIES
from ..search.buckets import BUCKETS, HEAD_DIMS, LARGE, LONG_RUN, LONG_RUN_CALLS, buckets, near_constant_buckets
from ..search.strategies import cases


@pytest.mark.parametrize("op", list(oracle.OPS))
def test_op_record_is_consistent(normcert_session, op):
    device = normcert_session.device
    rec = oracle.OPS[op]
    args = rec.sample(torch.float64, rows=3, width=6)
    assert set(args) == set(rec.tensors) | set(rec.scalars)
    rec.check(args)
    outs = oracle.forward(op, **args)
    shape = rec.out_shape(tuple(args[rec.main].shape))
    assert [o.shape for o in outs] == list(rec.value_shapes(tuple(args[rec.main].shape), args))
    if rec.grads:
        grads = oracle.vjp(op, tuple(torch.ones(shape, dtype=torch.float64) for _ in rec.outputs), **args)
        assert set(grads) == set(rec.grads)
    else:
        with pytest.raises(ValueError, match="no VJP"):
            oracle.vjp(op, tuple(torch.ones(shape, dtype=torch.float64) for _ in rec.outputs), **args)
    assert set(rec.row_inputs) <= set(rec.tensors) and set(rec.grads) <= set(rec.tensors)
    for impl in impls.registry():
        if impl.op == op and impl.backend in ("eager", "compiled") and device in impl.devices:
            sample = rec.sample(torch.float32, device)
            want = rec.out_shapes(tuple(sample[rec.main].shape), sample)
            got = rec.call_outputs(impl.fn, sample)
            assert [tuple(o.shape) for o in got] == list(want), impl.id
            values = rec.value_shapes(tuple(sample[rec.main].shape), sample)  # as the checks see them
            assert [tuple(o.shape) for o in rec.decode(got, sample)] == list(values), impl.id


@pytest.mark.parametrize("op", [name for name, rec in oracle.OPS.items() if rec.unfused])
def test_a_fused_form_draws_as_its_base_does(op):
    """The fused factory carries the base op's drawing limits: a fused per-group op drawn with rows
    no group divides would be a harness failure, not the kernel's."""
    rec = oracle.OPS[op]
    base = oracle.OPS[rec.unfused]
    assert (rec.width_multiple, rec.max_width, rec.max_rank) == (base.width_multiple, base.max_width, base.max_rank)


def test_an_op_s_rows_reach_its_base_s_widths():
    """A derived op draws rows as long as its base's: a [gate | up] op's x twice its base's rows (its
    outputs reach the MLP widths, ``oracle.ops.MLP_WIDTH``), a quantised or masked form its base's
    (a quantised SiluAndMul capped below the widths models run at would certify a kernel that
    never loops past one block)."""
    ops = oracle.OPS
    assert ops["swiglu"].max_width == ops["geglu"].max_width == oracle.ops.MLP_WIDTH
    assert ops["silu_and_mul"].max_width == ops["gelu_and_mul"].max_width == 2 * oracle.ops.MLP_WIDTH
    for name in ("silu_and_mul_dynamic_quant", "silu_and_mul_group_quant", "silu_and_mul_group_quant_masked",
                 "silu_and_mul_fp4_quant"):
        assert ops[name].max_width == ops["silu_and_mul"].max_width, name
    for name in ("rms_norm_fp8", "rms_norm_dynamic_quant", "rms_norm_group_quant", "rms_norm_fp4_quant"):
        assert ops[name].max_width == ops["rms_norm"].max_width, name


def test_compiled_quantised_kernels_leave_float64_out():
    """Inductor's Triton backend has no float64 -> float8 conversion (``impls.compiled.QUANTISED_DOMAIN``,
    seen on an H100): a compiled quantised kernel's float64 calls fail to compile, so its domain leaves
    float64 out; every other compiled kernel's keeps it."""
    from ...impls import compiled

    for impl in compiled.IMPLS:
        quantised = any(o.quantised for o in oracle.OPS[impl.op].outs)
        assert ("float64" not in (impl.domain.dtypes or ("float64",))) == quantised, impl.id


def _family_marks() -> dict[str, tuple[str | None, bool]]:
    """Every test function of the suite's test files, read from their source (a test file is never
    imported by another): "file::test" -> (the family its ``normcert_family`` mark names, or None;
    does it take ``impl``)."""
    found = {}
    for path in sorted(Path(suite.__file__).parent.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            names = [d.args[0].value for d in node.decorator_list if isinstance(d, ast.Call)
                     and isinstance(d.func, ast.Attribute) and d.func.attr == "normcert_family"]
            assert len(names) <= 1, f"{path.name}::{node.name} names {len(names)} families"
            found[f"{path.name}::{node.name}"] = (names[0] if names else None,
                                                  "impl" in [a.arg for a in node.args.args])
    return found


def test_every_family_has_exactly_one_test():
    """The plugin parametrizes a test by the family its mark names (``family.covers``) and the
    certificate expects a result of every family (``families.expected``): a family with no test
    would leave every certificate incomplete, one with two would count its results twice."""
    marks = _family_marks()
    for family in FAMILIES:
        tests = [t for t, (name, _) in marks.items() if name == family.name]
        assert len(tests) == 1, f"{family.name}: run by {tests or 'no test'}"
        assert (family.check is None) == (family.cases is None), family.name
    unknown = {name for name, _ in marks.values()} - set(BY_NAME) - {None}
    assert not unknown, f"tests name no family of FAMILIES: {sorted(unknown)}"


def test_every_property_test_belongs_to_a_family():
    """A test of a kernel (it takes ``impl``) runs a family, so no test escapes ``applies`` and the
    certificate; the contract's dtype-support test is the one check of a kernel that is no family."""
    for test, (name, takes_impl) in _family_marks().items():
        if takes_impl and test != "test_contract.py::test_supports_some_dtype":
            assert name is not None, f"{test} tests a kernel but names no property family"


def test_bitwise_families_skip_case_studies_unless_bitwise():
    registry = impls.registry()
    study = next(i for i in registry if i.expected_failure)
    eager = next(i for i in registry if i.backend == "eager" and i.op == study.op)
    for family in FAMILIES:
        # a pair family: --agree kernels alone; a compiling family: torch operators and --compile alone
        if family.applies(oracle.OPS[study.op]) and not family.pair and not family.compiles:
            assert family.covers(eager, bitwise=False) and family.covers(study, bitwise=True)
            assert family.covers(study, bitwise=False) == (not family.bitwise), family.name


def _first_case(strategy):
    """The case Hypothesis tries first from ``strategy`` (its simplest, which a bucket spins)."""
    seen = []

    @settings(max_examples=1, database=None, deadline=None)
    @given(case=strategy)
    def draw(case):
        seen.append(case)

    draw()
    return seen[0]


@pytest.mark.parametrize("op", list(oracle.OPS))
def test_every_bucket_of_every_family_draws_its_shape(op):
    """Each family's buckets are buckets, and the case it draws for each has the bucket's shape
    (its width capped at the op's max_width) and, for "strided", a row stride larger than the width."""
    rec = oracle.OPS[op]
    for family in FAMILIES:
        assert set(family.buckets) <= set(LARGE if family.profile else BUCKETS + (LONG_RUN,)), family.name
        if not family.applies(rec):
            continue
        for b in buckets(rec, spin=7):
            if b.name not in family.buckets:
                continue
            case = _first_case(family.cases(op, torch.float32, "cpu", bucket=b))
            x = case.main
            assert tuple(x.shape) == b.shape(rec) and case.notes["bucket"] == b.label, (family.name, b)
            assert b.width <= rec.max_width
            if b.name == "strided":
                assert x.stride(0) > x.shape[-1]
            if b.name == "million":
                assert x.numel() > 2 ** 20 and x.is_contiguous()
            if b.name == LONG_RUN:
                assert case.params["calls"] == b.calls == LONG_RUN_CALLS


def test_near_constant_buckets_keep_a_per_group_ops_widths():
    """Near-constant rows of an op whose groups divide every row (as ``benchmarks/tightness.py``
    draws them for every normalising op) are multiples of its width_multiple, as the shape buckets are."""
    rec = replace(oracle.OPS["rms_norm_group_quant"], centred=True)
    widths = [b.width for b in near_constant_buckets(rec, spin=3)]
    assert widths and all(w % rec.width_multiple == 0 for w in widths), widths
    case = _first_case(BY_NAME["accuracy"].cases(rec.name, torch.float32, "cpu",
                                                 bucket=near_constant_buckets(rec, spin=3)[2]))
    assert case.main.shape[-1] % rec.width_multiple == 0


def test_bucket_cases_differ_from_seed_to_seed():
    """Spun: ten seeds pick several odd widths and ten different first cases, not Hypothesis's
    one simplest case (same profile, seed 0) every time."""
    rec = oracle.OPS["rms_norm"]
    assert len({buckets(rec, spin)[1].width for spin in range(10)}) >= 3
    firsts = [_first_case(BY_NAME["accuracy"].cases("rms_norm", torch.float32, "cpu", bucket=buckets(rec, spin)[1]))
              for spin in range(10)]
    assert len({c.notes["seed"] for c in firsts}) == 10
    assert len({c.notes["x"] for c in firsts}) >= 3


@pytest.mark.parametrize("op", [op for op, rec in oracle.OPS.items() if rec.headwise])
def test_random_search_draws_qk_norm_calls_for_headwise_ops(op):
    """Besides the qk bucket, the random search of a headwise op draws QK-norm calls: (tokens,
    heads, head_dim) views of a fused QKV buffer, head_dim from HEAD_DIMS, past 32 heads too."""
    def qk_past_32(case):
        x = case.main
        fused = x.dim() == 3 and x.stride(0) == 3 * x.shape[1] * x.shape[2]
        return fused and x.shape[-1] in HEAD_DIMS and x.shape[1] > 32

    found = find(cases(op, torch.float32, "cpu"), qk_past_32, settings=settings(database=None, max_examples=500))
    assert found.main.storage_offset() == found.main.shape[1] * found.main.shape[2]  # the k part


@pytest.mark.parametrize("op", [op for op, rec in oracle.OPS.items() if "scale" in rec.scalars])
def test_our_kernels_reject_a_bad_scale(normcert_session, op):
    """A scale <= 0 or not finite: a ValueError naming it, from each of our kernels (as from the oracle)."""
    rec = oracle.OPS[op]
    ours = [i for i in impls.registry() if i.op == op and i.backend in ("eager", "triton")
            and normcert_session.device in i.devices]
    assert len(ours) == 2
    for impl in ours:
        for scale in (0.0, -1.0, float("inf"), float("nan")):
            with pytest.raises(ValueError, match=f"^{op}: scale must be a positive finite float"):
                rec.call(impl.fn, {**rec.sample(torch.float32, normcert_session.device), "scale": scale})


@pytest.mark.parametrize("op", ["silu_and_mul_dynamic_quant", "silu_and_mul_group_quant"])
def test_silu_and_mul_quant_is_silu_and_mul_quantised(op):
    """The SwiGLU quant records are derived, not written: a halves op whose oracle is silu_and_mul's
    output quantised as the norm quant ops quantise rms_norm's (y times its scale gives silu_and_mul's
    exact value back), one scale per output row or per group of it."""
    rec, base = oracle.OPS[op], oracle.OPS["silu_and_mul"]
    assert rec.halves and not rec.grads and rec.main == "x" and rec.outputs == ("y", "scales")
    args = rec.sample(torch.float64, rows=3, width=6)
    y, scales = oracle.forward(op, **args)
    (v,) = oracle.forward("silu_and_mul", x=args["x"])
    n = v.shape[-1]
    assert y.shape == v.shape and n == args["x"].shape[-1] // 2
    per = scales[..., None] if scales.ndim < y.ndim else np.repeat(scales, args["group"], axis=-1)
    used = per if op.endswith("dynamic_quant") or args["scale_format"] == "float32" else 2.0 ** np.ceil(np.log2(per))
    assert np.allclose(y * used, v, rtol=1e-15, atol=0)
    assert rec.width_multiple == (oracle.OPS["rms_norm_group_quant"].width_multiple if "group" in op else 1)


def test_silu_and_mul_group_quant_groups_its_output_row():
    """The group divides the output row, H = n / 2 wide, not x's: a group of 128 on x of width 256 is
    one group per row; on x of width 128 (H = 64) it is a ValueError naming the argument."""
    x = torch.randn(2, 256, dtype=torch.float64)
    y, scales = oracle.forward("silu_and_mul_group_quant", x=x, group=128, scale_format="float32", layout="row_major")
    assert y.shape == (2, 128) and scales.shape == (2, 1)
    with pytest.raises(ValueError, match="group"):
        oracle.forward("silu_and_mul_group_quant", x=x[:, :128], group=128, scale_format="float32", layout="row_major")


def test_silu_and_mul_group_quant_draws_whole_groups_of_its_output():
    """Rows drawn (at random and in buckets) leave output rows a multiple of the largest group."""
    rec = oracle.OPS["silu_and_mul_group_quant"]
    for b in buckets(rec, spin=5):
        assert b.shape(rec)[-1] // 2 % rec.width_multiple == 0, b
    case = _first_case(BY_NAME["accuracy"].cases(rec.name, torch.float32, "cpu"))
    assert case.main.shape[-1] // 2 % rec.width_multiple == 0


def test_masked_moe_record_claims_the_counted_rows_only():
    """silu_and_mul_group_quant_masked is silu_and_mul_group_quant on each expert's first counts[e]
    rows; the rows past them are read as zeros by the oracle (whatever x holds there) and carry no
    claim (``Op.valid``); counts outside [0, tokens], of a float dtype or of another shape are a
    ValueError naming counts, from the oracle and from the eager kernel."""
    from ...impls import eager

    rec = oracle.OPS["silu_and_mul_group_quant_masked"]
    assert rec.counts == "counts" and rec.halves and not rec.grads
    x = torch.randn(3, 4, 256, dtype=torch.float64)
    counts = torch.tensor([0, 4, 2])
    padded = x.clone()
    padded[0], padded[2, 2:] = float("nan"), float("inf")
    kw = dict(group=64, scale_format="ue8m0", layout="row_major")
    y, scales = oracle.forward(rec.name, x=padded, counts=counts, **kw)
    valid = rec.valid({"x": x, "counts": counts})
    assert valid.tolist() == [[False] * 4, [True] * 4, [True, True, False, False]]
    dense_y, dense_s = oracle.forward("silu_and_mul_group_quant", x=x[valid], **kw)
    assert np.array_equal(y[valid.numpy()], dense_y) and np.array_equal(scales[valid.numpy()], dense_s)
    assert np.isfinite(y).all()  # the padding, NaN and inf, is never read
    for bad in (torch.tensor([0, 5, 1]), torch.tensor([-1, 0, 0]), torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1, 2])):
        with pytest.raises(ValueError, match="counts"):
            oracle.forward(rec.name, x=x, counts=bad, **kw)
        with pytest.raises(ValueError, match="counts"):
            eager.silu_and_mul_group_quant_masked(x, bad, **kw)


def test_masked_moe_counts_are_drawn_with_both_ends():
    """The counts strategy draws 0 and tokens among its values, int32 and int64, and with padded=True
    always leaves a padded row; the drawn x keeps the valid rows' values."""
    from ..search.strategies import counts as draw_counts

    seen, dtypes = set(), set()

    @settings(max_examples=60, database=None, deadline=None)
    @given(data=st.data())
    def run(data):
        rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
        padded = data.draw(st.booleans())
        c, _ = data.draw(draw_counts(rng, (4,), 5, "cpu", padded=padded))
        assert c.shape == (4,) and 0 <= int(c.min()) and int(c.max()) <= 5
        if padded:
            assert (c < 5).any()
        seen.update(c.tolist())
        dtypes.add(c.dtype)

    run()
    assert {0, 5} <= seen and dtypes == {torch.int32, torch.int64}


def test_a_group_is_checked_without_its_tensor_as_a_replay_file_checks_scalars():
    """A replay file's scalars are checked before its tensors load (x is None then): a group is a
    positive integer there, and divides the row once x is known.  Before, every per-group failure's
    replay file was refused with an AttributeError."""
    from ...oracle.kinds import KINDS

    KINDS["group"].check("silu_and_mul_group_quant_masked", "group", 128, None)
    with pytest.raises(ValueError, match="group must be a positive integer"):
        KINDS["group"].check("silu_and_mul_group_quant_masked", "group", 0, None)
