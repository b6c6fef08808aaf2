"""Declared domains: a kernel states what it supports, the suite checks it there and nowhere else.

* ``properties.declared.domain.parse`` reads every key, says a domain back in its own syntax, and refuses a bad
  one in one line naming the key; it reads text or a plain dict, never an object the kernel built
  (a Domain subclass that says nothing), and refuses a domain whose fitted cases would not fit
  ``MAX_FITTED_ELEMENTS``;
* ``fitting.fit`` puts any drawn case of any op inside any domain, and keeps it a valid input;
* an honest kernel that refuses rows not a multiple of 8 is certified once it declares so, and
  fails (the refusal named) while it does not; a refusal inside a declared domain fails; a
  dtype outside it is not drawn; a kernel wrong inside its domain still fails;
* support is not decided by the 2x4 probe alone: refusing the probe and accepting other cases fails.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ....impls import make
from ....impls import UsageError
from ....impls import registry as impls_registry
from ...declared.domain import MAX_FITTED_ELEMENTS, Domain, DomainError, parse
from ....oracle import OPS
from ....oracle.formats import DTYPE_NAMES, DTYPES
from ...run import runner
from ...families import BY_NAME
from ...search.case import Case
from ...search.fitting import fit
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...search.strategies import cases

from . import hostile

F32, F64 = torch.float32, torch.float64


@pytest.fixture
def session(tmp_path):
    return Session(failures_dir=str(tmp_path))


def _impl(fn, **kw):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.hostile:{fn.__name__}", **kw)


def _run(session, fn, dtype=F32, family="accuracy", **kw):
    return runner.run_family(session, BY_NAME[family], _impl(fn, **kw), dtype, max_examples=20)


# ------------------------------------------------------------------ the syntax
def test_parse_reads_every_key_and_says_the_domain_back():
    spec = ("dtypes=bfloat16,float16; params=same residual=float32 max_width=8192 width_multiple=8 contiguous=last "
            "ranks=3,2 weightless=no")
    d = parse(spec)
    assert d == Domain(("float16", "bfloat16"), "same", "float32", 8192, 8, "last", (2, 3), False)
    assert parse(d.spec()) == d == parse({"dtypes": ["float16", "bfloat16"], "params": "same", "residual": "float32",
                                          "max_width": 8192, "width_multiple": 8, "contiguous": "last",
                                          "ranks": (2, 3), "weightless": False})
    assert d.describe() == ("dtypes float16, bfloat16; weights in x's dtype; residual stream in float32 (for float16 / "
                            "bfloat16 x); row length a multiple of 8 and at most 8192; last dim contiguous (stride 1); "
                            "rank 2 or 3; no weightless calls")
    assert not parse("").declared and parse(None) == Domain()
    graphs = parse("capturable=yes")
    assert graphs.capturable is True and parse(graphs.spec()) == graphs and graphs.describe() == \
        "capturable=yes (a failed CUDA-graph capture fails; captured on a GPU only)"


@pytest.mark.parametrize("spec, says", [
    ("width=8", "unknown key 'width'"),
    ("contiguous", "'contiguous' must look like KEY=VALUE"),
    ("width_multiple=0", "width_multiple='0': expected a whole number >= 1"),
    ("max_width=8.5", "max_width='8.5': expected a whole number >= 1"),
    ("dtypes=float8", "dtypes='float8': expected some of float64, float32"),
    ("ranks=1", "ranks='1': expected some of 2, 3, 4"),
    ("weightless=maybe", "weightless='maybe': expected yes or no"),
    ("contiguous=rows", "contiguous='rows': expected one of last, all"),
    ("residual=bfloat16", "residual='bfloat16': expected one of same, float32"),
    ("max_width=4 width_multiple=8", "max_width=4 is below width_multiple=8: no row fits"),
    ("ranks=2 ranks=3", "ranks given twice"),
    ("capturable=sometimes", "capturable='sometimes': expected yes or no"),
])
def test_a_bad_domain_is_one_line_naming_the_key(spec, says):
    with pytest.raises(DomainError) as e:
        parse(spec)
    assert says in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("--domain")


def test_a_bad_attribute_is_a_usage_error_naming_the_kernel():
    def k(x, weight, eps):
        return x

    k.normcert_domain = "width_multiple=eight"
    with pytest.raises(UsageError, match="'k': normcert_domain: width_multiple='eight'"):
        _impl(k)


class _Quiet(Domain):
    """A domain object a kernel built: it says nothing of what it restricts."""

    def describe(self) -> str:
        return ""

    def spec(self) -> str:
        return ""


class _Eight(str):
    """A str a kernel built: equal to anything."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


@pytest.mark.parametrize("declared, says", [
    (_Quiet(max_width=8), "a _Quiet object is not accepted"),
    (Domain(max_width=8), "a Domain object is not accepted"),
    (_Eight("max_width=8"), "expected a string of KEY=VALUE items or a dict, got _Eight"),
    ({"params": _Eight("same")}, "'params': expected string keys and values that are strings"),
])
def test_a_domain_is_read_only_from_text_or_a_plain_dict(declared, says):
    def k(x, weight, eps):
        return x

    k.normcert_domain = declared
    with pytest.raises(UsageError, match=f"'k': normcert_domain: {says}"):
        _impl(k)


def test_a_record_built_with_a_domain_object_is_refused_or_read_again():
    """An entry point hands over Impl records it built: their domain is read again from its fields."""
    plain = _impl(hostile.rms_multiple_of_8)
    with pytest.raises(UsageError, match="'rms_multiple_of_8': domain: a _Quiet object is not accepted"):
        dataclasses.replace(plain, domain=_Quiet(max_width=8))
    again = dataclasses.replace(plain, domain=Domain(dtypes=("float32",), max_width="64"))
    assert again.domain == Domain(dtypes=("float32",), max_width=64)


@pytest.mark.parametrize("op, multiple, most", [("rms_norm", 65536, 2047), ("silu_and_mul", 4096, 2046)])
def test_a_domain_too_large_to_fit_is_a_usage_error_naming_the_limit(op, multiple, most):
    """65537 rows (the "many" bucket) widened to 65536 would be 17 GB of float32: refused when the
    kernel is registered (the attribute) or given its domain (--domain), before any case."""
    def k(x, *args):
        return x

    k.normcert_domain = f"width_multiple={multiple}"
    says = (rf"'k': {{}}: width_multiple={multiple} fits {op}'s largest case \(65537 rows\) to rows of {multiple}, "
            rf"{65537 * multiple} elements, past normcert's limit of {MAX_FITTED_ELEMENTS} elements "
            rf"\(for {op}: width_multiple at most {most}\)")
    with pytest.raises(UsageError, match=says.format("normcert_domain")):  # the source named: the attribute
        make(op, "k", "plugin", k)
    k.normcert_domain = f"width_multiple={most}"
    fits = make(op, "k", "plugin", k)
    with pytest.raises(UsageError, match=says.format("domain")):
        dataclasses.replace(fits, domain=parse(f"width_multiple={multiple}"))


def test_flags_are_read_said_back_and_checked_against_the_op():
    d = parse({"flags": ["norm_before_gate:yes"], "dtypes": "float32"})
    assert d.flags == (("norm_before_gate", True),) and parse(d.spec()) == d
    assert d.spec() == "dtypes=float32 flags=norm_before_gate:yes" and d.describe() == "dtypes float32; norm_before_gate=yes"
    with pytest.raises(UsageError, match=r"^'k': domain: flags=norm_before_gate:no: norm_before_gate is not a flag "
                                         r"argument of rms_norm \(its flags: none\)$"):
        make("rms_norm", "k", "plugin", lambda x, weight, eps: x, domain="flags=norm_before_gate:no")


@pytest.mark.parametrize("spec, says", [
    ("flags=norm_before_gate", "flags='norm_before_gate': expected NAME:yes or NAME:no items"),
    ("flags=norm_before_gate:true", "flags='norm_before_gate:true': expected NAME:yes or NAME:no items"),
    ("flags=norm_before_gate:yes,norm_before_gate:no", "norm_before_gate given twice"),
])
def test_a_bad_flags_item_is_one_line_naming_the_key(spec, says):
    with pytest.raises(DomainError) as e:
        parse(spec)
    assert says in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("--domain: flags=")


# ------------------------------------------------------------------ fitting
DOMAINS = st.builds(Domain, dtypes=st.none(), params=st.sampled_from([None, "same", "float32"]),
                    residual=st.sampled_from([None, "same", "float32"]),
                    max_width=st.sampled_from([None, 16, 100, 8192]), width_multiple=st.sampled_from([1, 3, 8, 16]),
                    contiguous=st.sampled_from([None, "last", "all"]),
                    ranks=st.sampled_from([None, (2,), (3,), (2, 4), (4,)]), weightless=st.sampled_from([None, False]))


def _inside(case, d: Domain) -> list[str]:
    """What of ``case`` lies outside ``d`` (checked here from the definitions, not with fit's helpers)."""
    rec, x = case.record, case.main
    bad = []
    n = x.shape[-1]
    if n % d.width_multiple or (d.max_width is not None and n > d.max_width) or (rec.halves and n % 2):
        bad.append(f"row length {n}")
    if d.ranks is not None and x.dim() not in d.ranks:
        bad.append(f"rank {x.dim()}")
    for k, t in case.tensors.items():
        if t is None:
            if d.weightless is False and k in rec.optional:  # a mask given as None is no weightless call
                bad.append(f"{k} None")
            continue
        if d.contiguous == "all" and not t.is_contiguous():
            bad.append(f"{k} not contiguous")
        if d.contiguous == "last" and t.dim() and t.numel() and t.shape[-1] > 1 and t.stride(-1) != 1:
            bad.append(f"{k} last dim strided")
        kind = next(a.kind for a in rec.args if a.name == k)
        if d.params is not None and kind in ("weight", "bias", "vector"):
            want = x.dtype if d.params == "same" else torch.float32
            if t.dtype != want:
                bad.append(f"{k} in {t.dtype}")
        if d.residual is not None and kind == "stream":
            wide = d.residual == "float32" and x.dtype in (torch.float16, torch.bfloat16)
            if t.dtype != (torch.float32 if wide else x.dtype):
                bad.append(f"{k} in {t.dtype}")
    return bad


@settings(max_examples=60, deadline=None)
@given(data=st.data(), op=st.sampled_from(sorted(OPS)), dtype=st.sampled_from(DTYPES), d=DOMAINS)
def test_a_fitted_case_lies_in_its_domain_and_is_still_a_valid_input(data, op, dtype, d):
    if d.max_width is not None and d.max_width < d.width_multiple * (2 if OPS[op].halves else 1):
        d = Domain(**{**d.__dict__, "max_width": None})
    case = data.draw(cases(op, dtype, "cpu", max_elems=1 << 12))
    fitted = fit(case, d)
    assert not _inside(fitted, d), (_inside(fitted, d), fitted.describe())
    OPS[op].check(fitted.oracle_args())  # the signature still holds: ValueError otherwise
    if fitted.main.shape != case.main.shape or "fitted" in fitted.notes:
        assert fitted.notes["fitted"]


def test_fitting_keeps_the_values_it_keeps():
    x = torch.arange(12.0).reshape(2, 6)
    w = torch.ones(6)
    c = Case("rms_norm", {"x": x, "weight": w}, {"eps": 1e-6})
    grown = fit(c, Domain(width_multiple=8))
    assert grown.main.shape == (2, 8) and torch.equal(grown.main[:, :6], x) and torch.equal(grown.main[:, 6:], x[:, :2])
    cut = fit(c, Domain(width_multiple=4, max_width=4))
    assert torch.equal(cut.main, x[:, :4]) and cut.notes["fitted"] == "row length 6 -> 4"


# ------------------------------------------------------------------ verdicts
def test_partial_support_without_a_declared_domain_fails_and_says_to_declare_it(session):
    # the 2x4 sample is refused (4 is not a multiple of 8), a drawn case of 64 is not
    with pytest.raises(PropertyFailure, match=r"refused the op's sample in float32 \(NotImplementedError\) but "
                                              r"accepted this case: .* or be declared \(normcert_domain\)"):
        _run(session, hostile.rms_multiple_of_8_undeclared)
    assert session.results[-1].outcome == "fail"


def test_a_kernel_that_declares_its_domain_is_certified_on_it(session):
    for family in ("accuracy", "extremes", "contract", "invariance", "row-independence", "gradients", "determinism"):
        res = _run(session, hostile.rms_multiple_of_8, family=family)
        assert res.outcome == "pass", (family, res.message)
    assert _impl(hostile.rms_multiple_of_8).domain.describe() == "row length a multiple of 8"


def test_the_fusion_partner_is_one_whose_domain_takes_the_sum(tmp_path):
    """A float32 residual stream beside a bfloat16 x sums to float32: the plugged rms_norm partner
    declares half precision only, so the fused kernel is compared with the eager one there."""
    registry = impls_registry()
    session = Session(failures_dir=str(tmp_path), eager={i.op: i for i in registry if i.backend == "eager"},
                      impls=[_impl(hostile.rms_half_precision_only)])
    fused = next(i for i in registry if i.op == "add_rms_norm" and i.backend == "eager")
    res = runner.run_family(session, BY_NAME["fusion"], fused, torch.bfloat16, max_examples=20)
    assert res.outcome == "pass", res.message


def test_a_domain_given_with_the_registry_entry_or_the_command_line_counts_like_the_attribute(session):
    res = _run(session, hostile.rms_multiple_of_8_undeclared, domain="width_multiple=8")
    assert res.outcome == "pass", res.message


def test_a_refusal_inside_the_declared_domain_fails(session):
    with pytest.raises(PropertyFailure, match=r"refused a case inside its declared domain \(row length a multiple "
                                              r"of 8\): rows longer than 64"):
        _run(session, hostile.rms_declares_8_refuses_past_64)


def test_a_dtype_outside_the_domain_is_not_drawn_and_inside_it_a_wrong_kernel_still_fails(session):
    calls = []

    def counted(x, weight, eps):
        calls.append(x.dtype)
        return hostile.rms_wrong_past_8192(x, weight, eps)

    counted.normcert_domain = hostile.rms_wrong_past_8192.normcert_domain
    res = _run(session, counted, F64)
    assert res.outcome == "not-supported" and not calls
    assert res.message == "outside its declared domain (dtypes float32, float16; row length at most 8192)"
    with pytest.raises(PropertyFailure, match="accuracy fails"):  # the long bucket, cut to 8192, finds it
        _run(session, counted, F32)
    width = re.search(r"x: float32\((?:\d+, )*(\d+),?\)", session.results[-1].worst_where).group(1)  # (n,) in 1-D
    assert 4096 < int(width) <= 8192


def test_the_probe_alone_does_not_decide_support(session):
    """Refusing the 2x4 float64 sample, computing float64 in float32 elsewhere: not "not-supported"."""
    with pytest.raises(PropertyFailure, match="refused the op's sample in float64 .* but accepted this case"):
        _run(session, hostile.rms_refuses_the_probe_only, F64)


def test_a_dtype_refused_everywhere_is_not_supported(session):
    def no_float64(x, weight, eps):
        if x.dtype == torch.float64:
            raise NotImplementedError("float64")
        return hostile.rms_multiple_of_8(x, weight, eps)

    res = _run(session, no_float64, F64)
    assert res.outcome == "not-supported" and res.refused == res.examples > 0
    assert res.message == f"raises NotImplementedError for float64: on the op's sample and all {res.examples} cases"


def test_a_declared_dtype_whose_sample_is_refused_fails(session):
    def refuses_bf16(x, weight, eps):
        if x.dtype == torch.bfloat16:
            raise NotImplementedError("bfloat16")
        return hostile.rms_multiple_of_8(x, weight, eps)

    refuses_bf16.normcert_domain = "dtypes=float32,bfloat16"
    with pytest.raises(PropertyFailure, match=r"refused the op's sample \(2 rows\) inside its declared domain"):
        _run(session, refuses_bf16, torch.bfloat16)
    assert [DTYPE_NAMES[d] for d in DTYPES if _impl(refuses_bf16).domain.admits_dtype(DTYPE_NAMES[d])] == \
        ["float32", "bfloat16"]


def _gated_impl(fn, **kw):
    return make("rms_norm_gated", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.hostile:{fn.__name__}",
                **kw)


def test_a_flag_value_refused_without_its_declaration_fails(session):
    """flash-linear-attention's FusedRMSNormGated gates after the norm only: refusing the gate-first
    cases is a refusal inside the domain while the kernel does not declare its flag."""
    with pytest.raises(PropertyFailure, match=r"refused the op's sample in float32 \(NotImplementedError\) but accepted "
                                              r"this case: .* or be declared \(normcert_domain\)"):
        runner.run_family(session, BY_NAME["accuracy"], _gated_impl(hostile.gated_after_norm_only_undeclared), F32,
                          max_examples=20)
    assert session.results[-1].outcome == "fail"


def test_a_kernel_that_declares_its_flag_is_drawn_and_certified_with_that_value(session):
    seen = set()

    def counted(x, z, weight, eps, norm_before_gate, group_size=None):
        seen.add(norm_before_gate)
        return hostile.gated_after_norm_only(x, z, weight, eps, norm_before_gate, group_size)

    counted.normcert_domain = hostile.gated_after_norm_only.normcert_domain
    for family in ("accuracy", "extremes", "gradients", "row-independence"):
        res = runner.run_family(session, BY_NAME[family], _gated_impl(counted), F32, max_examples=20)
        assert res.outcome == "pass", (family, res.message)
    assert seen == {True}
    assert _gated_impl(hostile.gated_after_norm_only).domain.describe() == "norm_before_gate=yes"
    fitted = fit(Case("rms_norm_gated", {"x": torch.ones(2, 4), "z": torch.ones(2, 4), "weight": torch.ones(4)},
                      {"eps": 1e-6, "norm_before_gate": False, "group_size": None}), parse("flags=norm_before_gate:yes"))
    assert fitted.scalars["norm_before_gate"] is True and fitted.notes["fitted"] == "norm_before_gate -> True"


def test_a_fitted_width_keeps_the_gated_norms_groups_dividing_it():
    x = torch.ones(2, 24)
    case = Case("rms_norm_gated", {"x": x, "z": x, "weight": torch.ones(24)},
                {"eps": 1e-6, "norm_before_gate": True, "group_size": 3})  # 8 groups
    assert fit(case, Domain(width_multiple=32)).scalars["group_size"] == 4  # 8 groups of 4
    cut = fit(case, Domain(width_multiple=5, max_width=20))  # 20 is no multiple of 8 groups: 4 of 5
    assert cut.scalars["group_size"] == 5 and "group_size 3 -> 5" in cut.notes["fitted"]
    OPS["rms_norm_gated"].check(cut.oracle_args())


def test_rank_and_layout_domains_reach_the_calls_a_property_derives(session):
    """Row-independence, the contract's layouts and batch-invariance make calls of their own (other
    rows, a contiguous copy, a batch of rows): they stay inside the domain too."""
    for family in ("accuracy", "contract", "row-independence", "gradients"):
        res = _run(session, hostile.rms_3d_contiguous_only, family=family)
        assert res.outcome == "pass" and re.search("layouts: contiguous(;|$)", res.domain), (family, res.message, res.domain)
    res = runner.run_family(session, BY_NAME["batch-invariance"], _impl(hostile.rms_3d_contiguous_only), F32,
                             max_examples=20, gating=False)
    assert "refused" not in res.message, res.message


@pytest.mark.parametrize("shape,ranks,want_x,want_counts", [
    ((5, 8), (3,), (1, 5, 8), (1,)),          # one expert given an expert dim
    ((3, 5, 8), (2,), (5, 8), ()),            # to (tokens, n): expert 0, never tokens of two experts mixed
    ((2, 3, 5, 8), (3,), (6, 5, 8), (6,)),    # expert dims flattened with their counts
])
def test_a_masked_moe_case_keeps_one_count_per_expert_when_its_rank_is_fitted(shape, ranks, want_x, want_counts):
    x = torch.randn(shape)
    counts = torch.arange(int(torch.tensor(shape[:-2]).prod()) if len(shape) > 2 else 1).reshape(shape[:-2]) % 6
    c = Case("silu_and_mul_group_quant_masked", {"x": x, "counts": counts},
             {"group": 4, "scale_format": "float32", "layout": "row_major"})
    fitted = fit(c, Domain(ranks=ranks))
    assert fitted.main.shape[:-1] == want_x[:-1] and fitted.tensors["counts"].shape == want_counts
    OPS[fitted.op].check(fitted.oracle_args())
    if len(shape) == 3 and ranks == (2,):
        assert torch.equal(fitted.main[:, :4], x[0, :, :4]) and int(fitted.tensors["counts"]) == int(counts[0])
