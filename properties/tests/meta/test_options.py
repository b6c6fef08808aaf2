"""An op's options are part of its contract, not a trap (issue 45, item 4).

An option (``oracle.record.Arg.option``: the gated norm's ``group_size``) is an argument an op gained
after kernels were written to it.  A kernel whose signature lacks it (transformers'
``Qwen3NextRMSNormGated`` convention, ``fn(x, z, weight, eps, norm_before_gate)``) is certified on
the cases without it, its domain saying "group_size not supported"; one that takes ``**kwargs`` (or
whose signature cannot be read) is assumed to take it unless it declares ``unsupported=NAME``:

* ``signature.takes`` reads a parameter that can be passed by keyword, ``**kwargs``, and assumes
  an unreadable signature takes every option;
* the record passes an option by keyword, and only in a case that gives it;
* ``unsupported=`` is read, said back, described and refused in one line where it names no option of
  the op; fitting takes the option out of a case drawn with it;
* the planted five-argument kernel is certified with the narrowed domain, the same kernel with a
  planted bug is still rejected, a ``**kwargs`` kernel that declares the key is certified and never
  given the option, and the same kernel undeclared is given it (and rejected, since it ignores it);
* from a user's folder, ``normcert certify rms_norm_gated=mykern:fn`` exits 0 and the certificate says
  "certified on: group_size not supported" (the heavy tier: a full certify in a fresh process).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from ....impls import UsageError, make
from ....impls.eager import rms_norm_gated as eager_gated
from ....oracle import OPS
from ....oracle.record import Arg
from ...declared.domain import Domain, DomainError, parse
from ...declared.signature import lacking, takes
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner
from ...search.case import Case
from ...search.fitting import fit

from . import planted

GATED = OPS["rms_norm_gated"]
FAMILIES = ("accuracy", "extremes", "gradients", "row-independence")


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path))


def _impl(fn, **kw):
    return make("rms_norm_gated", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted:{fn.__name__}",
                **kw)


# ------------------------------------------------------------------ reading a signature
def _five(x, z, weight, eps, norm_before_gate):
    return x


def _grouped(x, z, weight, eps, norm_before_gate, group_size=None):
    return x


def _positional_only(x, z, weight, eps, norm_before_gate, group_size=None, /):
    return x


def _keywords(x, z, weight, eps, norm_before_gate, **kwargs):
    return x


@functools.wraps(_five)
def _wrapped(*args, **kwargs):
    return _five(*args, **kwargs)


@pytest.mark.parametrize("fn, taken", [
    (_five, False), (_grouped, True), (_positional_only, False), (_keywords, True), (_wrapped, False),
    (torch.rsqrt, True),  # a builtin: no signature to read, assumed to take it
    (torch.ops.aten.rms_norm, True),  # a torch operator: (*args, **kwargs), assumed to take it
], ids=["five arguments", "group_size=None", "positional only", "**kwargs", "functools.wraps", "builtin", "torch op"])
def test_a_signature_says_whether_it_takes_an_option(fn, taken):
    assert takes(fn, "group_size") is taken
    assert lacking(GATED, fn) == (() if taken else ("group_size",))
    assert lacking(OPS["rms_norm"], fn) == ()  # an op without options lacks none


# ------------------------------------------------------------------ the record's call
def test_the_record_passes_an_option_by_keyword_and_only_where_a_case_gives_it():
    assert GATED.options == ("group_size",) and OPS["rms_norm"].options == ()
    seen = []

    def grouped(x, z, weight, eps, norm_before_gate, **kwargs):
        seen.append(kwargs)
        return x

    args = GATED.sample(torch.float32)
    assert args["group_size"] is None
    GATED.call(_five, args)  # the five-argument convention, called as it always was
    GATED.call(grouped, args)
    GATED.call(grouped, {**args, "group_size": 3})
    assert seen == [{}, {"group_size": 3}]
    with pytest.raises(ValueError, match="a eps cannot be None .absent., so it cannot be an option"):
        Arg("eps", "eps", option=True)


# ------------------------------------------------------------------ the domain key and fitting
def test_unsupported_is_read_said_back_and_described():
    d = parse("unsupported=group_size flags=norm_before_gate:yes")
    assert d == Domain(flags=(("norm_before_gate", True),), unsupported=("group_size",))
    assert parse(d.spec()) == d == parse({"unsupported": ["group_size"], "flags": "norm_before_gate:yes"})
    assert d.describe() == "norm_before_gate=yes; group_size not supported"


@pytest.mark.parametrize("spec, says", [
    ("unsupported=", "'unsupported=' must look like KEY=VALUE"),
    ("unsupported=group-size", "unsupported='group-size': expected the names of options, comma-separated"),
    ("unsupported=,", "unsupported=',': expected the names of options"),
])
def test_a_bad_unsupported_is_one_line_naming_the_key(spec, says):
    with pytest.raises(DomainError) as e:
        parse(spec)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_unsupported_must_name_an_option_of_the_op():
    with pytest.raises(UsageError, match=r"^'eager': domain: unsupported=eps: eps is not an option of rms_norm_gated "
                                         r"\(its options: group_size\)$"):
        make("rms_norm_gated", "eager", "plugin", eager_gated, domain="unsupported=eps")
    with pytest.raises(UsageError, match=r"unsupported=group_size: group_size is not an option of rms_norm \(its "
                                         r"options: none\)"):
        make("rms_norm", "five", "plugin", _keywords, domain="unsupported=group_size")


def test_fitting_takes_an_unsupported_option_out_of_a_case_drawn_with_it():
    x = torch.ones(2, 24)
    case = Case("rms_norm_gated", {"x": x, "z": x, "weight": torch.ones(24)},
                {"eps": 1e-6, "norm_before_gate": True, "group_size": 3})
    fitted = fit(case, parse("unsupported=group_size width_multiple=32"))  # removed first: not resized
    assert fitted.scalars["group_size"] is None and fitted.tensors["x"].shape == (2, 32)
    assert fitted.notes["fitted"] == "group_size -> None (not supported); row length 24 -> 32"
    GATED.check(fitted.oracle_args())
    whole = case.copy(scalars={**case.scalars, "group_size": None})
    assert "fitted" not in fit(whole, parse("unsupported=group_size")).notes  # nothing to take out


def test_the_narrowing_is_the_registrys_whatever_the_domain_says():
    """Read from the signature at registration, it stays when ``--domain`` replaces the declared
    domain (``dataclasses.replace``), and is not added twice where the kernel also declares it."""
    impl = _impl(planted.gated_five_arguments)
    assert impl.domain == Domain(unsupported=("group_size",))
    assert impl.domain.describe() == "group_size not supported"
    replaced = dataclasses.replace(impl, domain=parse("dtypes=float32"))
    assert replaced.domain.describe() == "dtypes float32; group_size not supported"
    assert _impl(planted.gated_five_arguments, domain="unsupported=group_size").domain == impl.domain
    assert not make("rms_norm_gated", "eager", "eager", eager_gated).domain.declared  # takes it: no narrowing


# ------------------------------------------------------------------ the planted kernels
def test_a_kernel_written_before_group_size_is_certified_on_the_cases_without_it(session):
    impl = _impl(planted.gated_five_arguments)
    for family, dtype in [(family, torch.float32) for family in FAMILIES] + [("accuracy", torch.bfloat16)]:
        res = runner.run_family(session, BY_NAME[family], impl, dtype, max_examples=10)
        assert res.outcome == "pass", (family, dtype, res.message)
        if family == "accuracy":  # its scheduled buckets, drawn with groups, fitted to whole rows
            assert "(fitted to the domain)" in res.domain, res.domain


def test_the_same_kernel_with_a_planted_bug_is_still_rejected(session):
    impl = _impl(planted.gated_five_arguments_silu_of_x)
    assert impl.domain.describe() == "group_size not supported"
    with pytest.raises(PropertyFailure, match=r"accuracy fails for rms_norm_gated:gated_five_arguments_silu_of_x"):
        runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32, max_examples=10, shrink=False)


@pytest.mark.parametrize("fn", [planted.gated_mamba2_no_float64, planted.gated_transformers_no_float64],
                         ids=["mamba2 order", "transformers order"])
def test_a_five_argument_kernel_refusing_float64_is_certified_with_the_narrowing(fn, session):
    """Registration's narrowing ("group_size not supported") is no declaration of the author's: a
    kernel that declares nothing may refuse float64 with NotImplementedError (issue 53's regression:
    every float64 property failed with "refused the op's sample (2 rows) inside its declared
    domain").  An author's own declaration still makes a refusal inside it a failure."""
    impl = _impl(fn)
    assert impl.domain.describe() == "group_size not supported" and impl.narrowed == ("group_size",)
    assert not impl.declares
    for family in FAMILIES:
        res = runner.run_family(session, BY_NAME[family], impl, torch.float64, max_examples=5)
        assert res.outcome == "not-supported" and "NotImplementedError" in res.message, (family, res.message)
    res = runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32, max_examples=5)
    assert res.outcome == "pass" and "(fitted to the domain)" in res.domain, res.domain
    declared = _impl(fn, domain="ranks=2,3,4")
    assert declared.declares and declared.narrowed == ("group_size",)
    with pytest.raises(PropertyFailure, match=r"refused the op's sample \(2 rows, norm_before_gate=False\) inside its "
                                              r"declared domain "
                                              r"\(rank 2 or 3 or 4; group_size not supported\)"):
        runner.run_family(session, BY_NAME["accuracy"], declared, torch.float64, max_examples=5)
    assert not _impl(fn, domain="unsupported=group_size").narrowed  # said by the author: the author's


def test_a_five_argument_kernel_refusing_float64_with_a_bug_is_still_rejected(session):
    impl = _impl(planted.gated_mamba2_no_float64_silu_of_x)
    assert not impl.declares
    with pytest.raises(PropertyFailure, match=r"accuracy fails for rms_norm_gated:gated_mamba2_no_float64_silu_of_x"):
        runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32, max_examples=10, shrink=False)


def _ungrouped(seen):
    """A **kwargs kernel that normalises whole rows whatever it is given: right only without groups."""
    def kernel(x, z, weight, eps, norm_before_gate, **kwargs):
        seen.append(kwargs.get("group_size"))
        return eager_gated(x, z, weight, eps, norm_before_gate)
    return kernel


def test_a_kernel_that_declares_the_option_unsupported_is_never_given_it(session):
    seen = []
    kernel = _ungrouped(seen)
    kernel.normcert_domain = "unsupported=group_size"
    impl = _impl(kernel)
    assert impl.domain.describe() == "group_size not supported"
    for family in FAMILIES:
        res = runner.run_family(session, BY_NAME[family], impl, torch.float32, max_examples=10)
        assert res.outcome == "pass", (family, res.message)
    assert seen and set(seen) == {None}


def test_a_kwargs_kernel_that_does_not_declare_it_is_given_it(session):
    """Its signature reads as taking group_size, so the grouped cases are its own: ignoring the
    groups fails."""
    seen = []
    impl = _impl(_ungrouped(seen))
    assert not impl.domain.declared
    with pytest.raises(PropertyFailure, match=r"(?s)accuracy fails .* group_size=[1-9]"):
        runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32, max_examples=20, shrink=False)
    assert any(size is not None for size in seen)


# ------------------------------------------------------------------ from a user's folder
USER_KERNEL = '''
import torch
import torch.nn.functional as F


def fn(x, z, weight, eps, norm_before_gate):
    """A gated RMSNorm written before group_size existed: five arguments, whole rows."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, gate = x.to(compute), F.silu(z.to(compute))
    if not norm_before_gate:
        xf = xf * gate
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(compute)
    return (y * gate if norm_before_gate else y).to(x.dtype)
'''


@pytest.mark.normcert_heavy  # a full certify in a fresh process (about 20 s on 2 cores): the heavy tier
def test_normcert_certify_from_a_users_folder_certifies_the_five_argument_kernel(tmp_path):
    (tmp_path / "mykern.py").write_text(USER_KERNEL)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    command = os.path.join(os.path.dirname(sys.executable), "normcert")
    assert os.path.exists(command), f"normcert's command is not installed beside {sys.executable}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    out = subprocess.run([command, "certify", "rms_norm_gated=mykern:fn", "--certificate", "c.json"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "normcert verdict: certified on: group_size not supported" in out.stdout, out.stdout[-3000:]
    certificate = json.loads((tmp_path / "c.json").read_text())
    kernel = certificate["implementations"]["rms_norm_gated:mykern:fn"]
    assert certificate["verdict"] == "certified"
    assert (kernel["domain"], kernel["certified_on"]) == ("unsupported=group_size", "group_size not supported")
    assert (tmp_path / "c.md").read_text().startswith("# normcert certificate: certified on: group_size not supported")
