"""The suite's teeth: planted bugs must be rejected, correct variants certified.

* every kernel declared ``@bug`` (``planted``, ``expect``) fails at least one property of the families
  listed beside it, with a message naming the property, dtype and shrunk case;
* a kernel's name does not choose its cases (seed shopping);
* every ``@bucket_bug`` kernel (right except on one scheduled shape) is
  rejected under the profile's examples on each of ``--meta-seeds`` seeds, and so is every
  ``@batch_size_bug`` kernel (a row's bits change with the batch size) under --bitwise;
* every ``@correct`` kernel passes every property in every dtype
  (``--meta-seeds K`` repeats that under K different global seeds; default 1).

Each runs the property checks in-process through ``runner.run`` -- the same
code path as the main tests -- so a property that cannot fail shows up here.
"""
from __future__ import annotations

import inspect
import re
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from hypothesis import Phase, given, settings

from ....impls import eager as eager_kernels
from ....impls import make
from ....oracle import OPS
from ....oracle.formats import DTYPES
from ...run import runner
from ...families.large import check_large, large_cases
from ...families import BY_NAME, CASE_CHECKS
from ...evidence.replay import load
from ...harness.measure import PropertyFailure, Worst
from ...harness.sandbox import ContractViolation
from ...run.outcomes import certify_large
from ...search.case import MAX_ELEMENTS
from ...harness.session import Session
from ...search.buckets import FAR_STRIDE_PAST, LARGE_WIDTH, large_buckets

from . import planted
from .expect import catalogue

BUGS, BUCKET_BUGS = catalogue(planted, "bug"), catalogue(planted, "bucket_bug")
BATCH_SIZE_BUGS = catalogue(planted, "batch_size_bug")
CORRECT = [(op, fn) for op, fn, _ in catalogue(planted, "correct")]

DTYPE_ORDER = (DTYPES[3], DTYPES[2], DTYPES[1], DTYPES[0])  # bf16, fp16, fp32, fp64: bugs show soonest in low precision


@pytest.fixture
def session(normcert_session, tmp_path):
    """A session of the meta-test's own: the run's device, seed and eager kernels (the fusion
    property's partners), replay files in tmp_path, no kernels under test of its own."""
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   eager=normcert_session.eager)


def _run(session, family, impl, dtype, **kw):
    return runner.run_family(session, family, impl, dtype, **kw)


def _impl(op, fn, backend="plugin"):
    return make(op, fn.__name__, backend, fn, target=f"normcert.properties.tests.meta.planted:{fn.__name__}")


def _first_failure(session, impl, props, max_examples):
    for family in CASE_CHECKS:
        if family.name not in props or not family.applies(OPS[impl.op]):
            continue
        for dtype in DTYPE_ORDER:
            try:
                res = _run(session, family, impl, dtype, max_examples=max_examples, shrink=False)
            except PropertyFailure as e:
                return family.name, str(e)
            if res.outcome == "not-supported":
                continue
    return None, None


@pytest.mark.parametrize("op, fn, families", BUGS, ids=[f.__name__ for _, f, _ in BUGS])
def test_planted_bug_is_rejected(op, fn, families, session):
    session.bitwise = True
    prop, message = _first_failure(session, _impl(op, fn), families, max_examples=40)
    assert prop is not None, f"planted bug {fn.__name__} ({inspect.getdoc(fn) or op}) survived {sorted(families)}"
    # not shrunk (shrinking is the case studies' and the replay tests' claim): whether it dies is this one's
    assert prop in message and "first failing case (not shrunk: not asked)" in message
    assert "replay: normcert replay " in message
    print(f"{fn.__name__}: rejected by {prop}: {message.splitlines()[0]}")


def _killed_on_every_seed(session, impl, families, seeds):
    """Under each of ``seeds`` consecutive global seeds, the profile's examples (no more) kill it."""
    base = session.seed
    for k in range(seeds):
        session.seed = base + k
        prop, message = _first_failure(session, impl, families, max_examples=None)
        assert prop is not None, f"{impl.id} ({inspect.getdoc(impl.fn)}) survived {sorted(families)} at seed {session.seed}"
        print(f"seed {session.seed}: {impl.id} rejected by {prop}: {message.splitlines()[0]}")
    session.seed = base


@pytest.mark.parametrize("op, fn, families", BUCKET_BUGS, ids=[f.__name__ for _, f, _ in BUCKET_BUGS])
def test_bucket_bug_is_killed_on_every_seed(op, fn, families, session, request):
    """Right on the shapes the random search draws, wrong on one bucket's: killed on every one of
    ``--meta-seeds`` seeds; and with the random search cut to one (the simplest) case, the
    scheduled cases alone kill it."""
    session.bitwise = True
    impl = _impl(op, fn)
    _killed_on_every_seed(session, impl, families, request.config.getoption("--normcert-meta-seeds"))
    prop, message = _first_failure(session, impl, families, max_examples=1)
    assert prop is not None, f"{fn.__name__} survived {sorted(families)}'s scheduled cases"
    assert "bucket=" in message, message


@pytest.mark.parametrize("op, fn, families", BATCH_SIZE_BUGS,
                         ids=[f.__name__ for _, f, _ in BATCH_SIZE_BUGS])
def test_batch_size_bug_is_killed_on_every_seed(op, fn, families, session, request):
    """Right in every batch, but a row's bits change with the batch size: killed under --bitwise
    on every one of ``--meta-seeds`` seeds, by a batch of another size than the case's; and with
    the random search cut to one (the simplest) case, by the scheduled cases alone."""
    session.bitwise = True
    impl = _impl(op, fn)
    _killed_on_every_seed(session, impl, families, request.config.getoption("--normcert-meta-seeds"))
    prop, message = _first_failure(session, impl, families, max_examples=1)
    assert prop is not None, f"{fn.__name__} survived {sorted(families)}'s scheduled cases"
    assert "bucket=" in message, message


def test_a_kernel_s_name_does_not_choose_its_cases(session):
    """The same code under two names (and modules) draws the same cases, scheduled and random:
    seeds derive from the global seed, the op, the property and the dtype, so a renamed kernel
    cannot shop for a seed that misses its bug."""
    family, seen = BY_NAME["batch-invariance"], {}

    def record(session, impl, case, worst):
        seen.setdefault(impl.id, []).append(case.describe())

    for target in ("theirs:rms_norm", "theirs_renamed:rms_norm_v2"):
        impl = make("rms_norm", target, "plugin", eager_kernels.rms_norm, target=target)
        buckets = [(b.label, family.cases(impl.op, torch.float32, session.device, bucket=b))
                   for b in runner.scheduled(session, family, impl, torch.float32)]
        runner.run(session, family.name, impl, torch.float32, family.cases(impl.op, torch.float32, session.device),
                    record, max_examples=12, buckets=buckets)
    first, second = seen.values()
    assert first == second and len(first) >= 12 + 2


def test_quantised_outputs_report_their_bit_exact_fraction(session):
    """A quantised op's certificate says how many of its fp8 outputs were the exactly rounded value
    (vLLM's order rounds to bfloat16 twice first, so not all); an op without one says nothing of it."""
    accuracy = BY_NAME["accuracy"]
    res = _run(session, accuracy, _impl("rms_norm_fp8", planted.rms_fp8_vllm_order), torch.bfloat16, max_examples=10)
    found = re.search(r"quantised outputs bit-exact \(the exactly rounded value\): (\d+) of (\d+)", res.domain)
    assert res.outcome == "pass" and found and 0 < int(found[1]) <= int(found[2]), res.domain
    res = _run(session, accuracy, _impl("rms_norm", planted.rms_llama_order), torch.bfloat16, max_examples=3)
    assert "bit-exact" not in res.domain


def test_a_warning_is_not_shrunk(session):
    """Without --bitwise a batch-invariance failure is a warning, found and not shrunk: the search
    stops at the failing case (Hypothesis runs it once more to report it)."""
    examples = 12
    res = _run(session, BY_NAME["batch-invariance"], _impl("rms_norm", planted.rms_batch_dependent), DTYPES[0],
               max_examples=examples, gating=False)
    assert res.outcome == "warn" and "differs in its bits" in res.message, (res.outcome, res.message)
    assert res.examples <= examples + 1, res.examples


@pytest.mark.parametrize("profile, shrunk", [("ci", False), ("thorough", True)])
def test_a_case_study_is_shrunk_only_under_the_thorough_profile(session, profile, shrunk):
    """A case study's failure is its expected verdict: under ci the first failing case stands (and
    says so), under thorough it is shrunk as any other failure."""
    session.profile = profile
    study = make("rms_norm", "study", "case-study", planted.rms_eps_outside_sqrt, expected_failure="planted",
                 target="normcert.properties.tests.meta.planted:rms_eps_outside_sqrt")
    with pytest.raises(PropertyFailure) as e:
        _run(session, BY_NAME["accuracy"], study, torch.float32, max_examples=12)
    said = str(e.value)
    assert ("shrunk case: " in said) == shrunk
    assert ("first failing case (not shrunk: a case study, expected to fail; --profile thorough shrinks it)"
            in said) == (not shrunk)


@pytest.mark.parametrize("fn, killed", [(planted.rms_offsets_wrap_past_2_16, True), (planted.rms_llama_order, False)],
                         ids=["wraps past 2**16", "correct"])
def test_large_family_at_a_cpu_scale(fn, killed, session):
    """The large family's cases and row sampling, crossing 2**16 elements instead of 2**31: a
    kernel whose row offsets wrap there is rejected on a row past the limit, a correct one passes."""
    rec, family = OPS["rms_norm"], BY_NAME["large"]
    impl = _impl("rms_norm", fn)
    schedule = [(b.label, large_cases("rms_norm", DTYPES[1], session.device, bucket=b,
                                                 limit=planted.SMALL_LIMIT))
                for b in large_buckets(rec, session.seed, planted.SMALL_LIMIT)]
    assert [b.split()[0] for b, _ in schedule] == list(family.buckets)
    if not killed:
        assert runner.run(session, family.name, impl, DTYPES[1], None, family.check,
                           buckets=schedule).outcome == "pass"
        return
    with pytest.raises(PropertyFailure, match=r"large fails .* y\[(\d+)") as e:
        runner.run(session, family.name, impl, DTYPES[1], None, family.check, buckets=schedule)
    row = int(re.search(r"y\[(\d+)", str(e.value)).group(1))
    stride = planted.SMALL_LIMIT + FAR_STRIDE_PAST if "bucket=far" in str(e.value) else LARGE_WIDTH
    assert row * stride >= planted.SMALL_LIMIT, str(e.value)  # the row named is one past the limit
    assert "replay: normcert replay" in str(e.value)  # small enough to save, unlike a GPU's case


def test_a_failing_case_too_large_to_save_is_freed_at_once(session):
    """A large case that fails is not written (a replay file could not hold it), and its tensors
    move to the meta device as the failure leaves the check: Hypothesis keeps the failure and
    runs the case again, which would hold two on the device.  The "far" case with limit
    MAX_ELEMENTS: 2 rows in a 256 MiB storage."""
    far = large_buckets(OPS["rms_norm"], session.seed, MAX_ELEMENTS)[1]
    strategy = large_cases("rms_norm", DTYPES[1], session.device, bucket=far, limit=MAX_ELEMENTS)
    impl = _impl("rms_norm", planted.rms_offsets_wrap_past_2_16)
    with pytest.raises(PropertyFailure, match="replay: not saved: x spans"):
        runner.run(session, "large", impl, DTYPES[1], None, check_large, buckets=[(far.label, strategy)])
    drawn = []

    @settings(max_examples=1, phases=[Phase.generate], database=None)
    @given(strategy)
    def draw(c):
        drawn.append(c)

    draw()
    case = drawn[0]
    with pytest.raises(PropertyFailure):
        check_large(session, impl, case, Worst())
    assert {t.device.type for t in case.tensors.values() if t is not None} == {"meta"}
    assert "far 2x4096" in case.describe()


def test_large_profile_rejects_int32_row_offsets_on_a_gpu(session, tmp_path):
    """The GPU check itself: a Triton RMSNorm whose row offset is int32 fails --profile large in
    bfloat16 (a subprocess: a wrapped offset may leave the CUDA context unusable)."""
    if session.device != "cuda":
        pytest.skip("needs --normcert-device cuda (cases past 2**31 elements)")
    impl = "rms_norm=normcert.properties.tests.meta.planted_triton:rms_norm_int32_offsets"
    out = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "normcert.properties.suite.test_large", "-p",
                          "no:xdist", "--normcert-impl", impl, "--hypothesis-profile", "large",
                          "--normcert-device", "cuda", "--normcert-dtype", "bfloat16", "--normcert-failures-dir",
                          str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "large fails for rms_norm:" in out.stdout, out.stdout[-3000:]


def test_large_profile_is_opt_in_and_says_why_it_skips_on_the_cpu():
    impl = _impl("rms_norm", planted.rms_llama_order)
    with pytest.raises(pytest.skip.Exception, match="opt-in: --profile large"):
        certify_large(Session(device="cpu"), BY_NAME["large"], impl, DTYPES[1])
    with pytest.raises(pytest.skip.Exception, match="for a GPU .--device cuda.; not run on cpu"):
        certify_large(Session(device="cpu", profile="large"), BY_NAME["large"], impl, DTYPES[1])


@pytest.mark.normcert_heavy  # a correct kernel certified on every family and dtype: the heavy tier
@pytest.mark.parametrize("op, fn", CORRECT, ids=[f.__name__ for _, f in CORRECT])
def test_correct_variant_is_certified(op, fn, session, request):
    impl = make(op, fn.__name__, "plugin", fn, backward=None)  # as `normcert certify` registers a plug-in
    base = session.seed
    for k in range(request.config.getoption("--normcert-meta-seeds")):
        session.seed = base + 1000 * k
        for family in CASE_CHECKS:
            # the bitwise pair is not a correctness claim; large is a GPU's (test_large_family_at_a_cpu_scale);
            # a variant's claim is its arithmetic, which served checks as accuracy does (its modes: test_modes)
            if family.bitwise or family.profile or family.name == "served" or not family.covers(impl, bitwise=False):
                continue
            for dtype in DTYPES:
                gated = family.backward and runner.forward_only(session, family, impl, dtype)
                if gated:  # forward only (rms_blocks_of_8192): not certified by the family, as certify's gate reads it
                    assert gated.outcome in ("not-certified", "not-supported"), (family.name, gated)
                else:
                    _run(session, family, impl, dtype)


def test_weightless_calls_are_checked_where_accepted_and_said_where_not(session):
    """A kernel that takes weight=None is checked on weightless calls; one that raises on None
    (the README's example) is certified on the same cases with ones for None, and its domain says
    so, not rejected for a call it was never written for."""
    eager = make("rms_norm", "eager", "eager", eager_kernels.rms_norm)
    required = _impl("rms_norm", planted.rms_weight_required)
    for impl, says in ((eager, r"weightless calls \(None weight / bias\): [1-9]\d* cases"),
                       (required, r"weightless calls not accepted \(raised on None\): None given as ones / zeros")):
        res = _run(session, BY_NAME["accuracy"], impl, torch.float32)
        assert res.outcome == "pass" and re.search(says, res.domain), (impl.id, res.domain)


def test_a_backward_that_writes_over_its_inputs_is_named_and_its_case_kept(session, tmp_path):
    """Liger's SwiGLU backward writes dgate and dup over the forward's gate and up: the failure names
    the input, whichever inputs require grad, and its replay file holds the values the forward was
    called on (the exact gradient is of those), so that it replays as the same failure."""
    session.failures_dir = str(tmp_path)
    impl = _impl("swiglu", planted.swiglu_backward_over_inputs)
    with pytest.raises(PropertyFailure, match="its backward wrote into its input '(gate|up)'") as e:
        _run(session, BY_NAME["gradients"], impl, torch.float32)
    replay = str(e.value).split("replay: ")[1].split()[-1]
    meta, case = load(replay, "cpu")
    for requires in ("all", "gate", "up"):  # the case's own gate / up passed as they are where not leaves
        kept = {k: t.clone() for k, t in case.tensors.items()}
        one = case.copy(context=replace(case.context, requires=requires))
        with pytest.raises(ContractViolation, match="its backward wrote into its input"):
            BY_NAME["gradients"].check(session, impl, one, Worst())
        assert all(torch.equal(kept[k], t) for k, t in one.tensors.items()), requires
    twin = _impl("swiglu", planted.swiglu_backward_beside_inputs)
    assert _run(session, BY_NAME["gradients"], twin, torch.float32).outcome == "pass"


@pytest.mark.parametrize("seed", [0] + [pytest.param(k, marks=pytest.mark.normcert_heavy) for k in range(1, 10)])
def test_a_float16_backward_that_rounds_dy_up_is_rejected_on_every_seed(session, seed):
    """Liger's GeGLU backward rounds dy * up to float16 before the product with gelu'(gate): past
    65504 it is inf, and dgate inf or NaN (inf * 0 where gelu'(gate) is 0) for a finite exact one.
    The issue found it on 2 of 4 seeds; the gradients family's buckets ("loud": values about 1e4)
    hold such products on every seed (one drawn example: seed 0 in the quick tier, 1 to 9 in the
    heavy one), and the twin keeping dy * up in float64 passes."""
    impl = _impl("geglu", planted.geglu_backward_rounds_dy_up)
    session.seed = seed
    with pytest.raises(PropertyFailure, match=r"gradients fails .* in float16: (in context [^:]*: )?dgate\["):
        _run(session, BY_NAME["gradients"], impl, torch.float16, max_examples=1, shrink=False)
    twin = _impl("geglu", planted.geglu_backward_keeps_dy_up)
    assert _run(session, BY_NAME["gradients"], twin, torch.float16, max_examples=1).outcome == "pass"


def test_a_backward_that_writes_over_dy_is_named(session):
    """Its gradients are right; the failure must say what is wrong: dy was overwritten (Liger's in_place=True)."""
    prop, message = _first_failure(session, _impl("rms_norm", planted.rms_backward_over_dy), {"gradients"}, 10)
    assert prop == "gradients" and "its backward wrote into the incoming gradient of 'y'" in message, message


def test_a_backward_that_writes_over_dy_is_certified_where_it_declares_so(session):
    """Liger's in_place=True RMSNorm, declared (``dy=overwritten``): its gradients are held to the VJP of
    the dy it was handed (not of what it left there), and the certificate's domain names the choice."""
    impl = make("rms_norm", "over_dy", "plugin", planted.rms_backward_over_dy, backward=None,
                domain="dy=overwritten")
    assert "dy=overwritten" in impl.domain.describe()
    for dtype in (torch.float64, torch.float32):
        assert _run(session, BY_NAME["gradients"], impl, dtype).outcome == "pass"


def test_a_per_row_output_is_compared_row_by_row_for_batch_invariance(session):
    """rms_norm_dynamic_quant's scales hold one value per row: batch invariance compares them row by
    row.  Taken as one row of the whole batch, a batch-invariant kernel's scales "differed" (every
    seed warned on normcert's Triton kernel, whose tile depends on the row length alone)."""
    from ....impls import triton_dynamic_quant  # noqa: PLC0415 - imports triton (the run has set up its interpreter)

    impl = make("rms_norm_dynamic_quant", "triton", "triton", triton_dynamic_quant.rms_norm_dynamic_quant)
    session.bitwise = True
    res = _run(session, BY_NAME["batch-invariance"], impl, torch.float32)
    assert res.outcome == "pass", res.message
