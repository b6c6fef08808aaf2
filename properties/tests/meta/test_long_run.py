"""The long run (``families.long_run``) has teeth, in every dtype of the run: a kernel right for its
first 2048 calls and wrong after (``planted_long_run``) is rejected on each of seeds 0-9
(``SEEDS``), the failure naming call 2049; so is one whose workspace ring is kept per dtype for its
bfloat16 path alone, one that hands out outputs from a ring of 3 or 4 persistent buffers (the
failure naming the two calls that share a storage) and one wrong one call in 5000 (naming the call);
each twin, one flag apart, is certified by the served family with its calls stated.  The full count
goes to one dtype of the run's scope, LONG_RUN_EVERY to each other one; the run makes exactly its
calls, and does not call again when Hypothesis replays its failing case.

The meta-test sessions make ``QUICK_LONG_RUN`` calls (past 2048 and 4096: about 0.3 s a run), or
LONG_RUN_EVERY where the bug needs 5000; the full 2**16 is ``normcert certify``'s, checked from a
user's folder in the heavy tier.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from ....impls import make
from ....impls.eager import rms_norm
from ....oracle.formats import DTYPE_NAMES
from ...families import BY_NAME
from ...families.long_run import CHUNK, long_run
from ...harness.measure import PropertyFailure, Worst
from ...harness.sandbox import ContractViolation
from ...harness.session import Session
from ...run import runner, schedule
from ...search.buckets import LONG_RUN, LONG_RUN_CALLS, LONG_RUN_EVERY, LONG_RUN_INTERPRETED, QUICK_LONG_RUN, buckets
from .... import oracle

from . import planted_long_run
from .planted_long_run import SAMPLE, SLOTS, DtypeRingRms, OutputRingRms, RingRms, SampledRms


def _impl(fn):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted_long_run:{fn.__name__}")


def _session(normcert_session, tmp_path, seed, calls=QUICK_LONG_RUN, dtypes=None):
    return Session(device=normcert_session.device, seed=seed, failures_dir=str(tmp_path), eager=normcert_session.eager,
                   long_run=calls, dtypes=dtypes)


def _long_run_only(session, impl, dtype):
    """The served family's run on its long-run bucket alone (no random search: its few calls add nothing)."""
    family = BY_NAME["served"]
    only = [(b.label, family.cases(impl.op, dtype, session.device, bucket=b))
            for b in runner.scheduled(session, family, impl, dtype) if b.name == LONG_RUN]
    assert len(only) == 1, "the long run is scheduled in every dtype"
    return runner.run(session, "served", impl, dtype, None, family.check, buckets=only, shrink=False)


def test_the_full_count_goes_to_one_dtype_of_the_scope_and_each_other_makes_long_run_every(normcert_session, tmp_path):
    impl = _impl(RingRms(zeroes=True))
    family = BY_NAME["served"]
    for seed in range(10):
        session = _session(normcert_session, tmp_path, seed, calls=LONG_RUN_CALLS)
        counts = {d: schedule.long_run_calls(session, impl, "served", d) for d in DTYPE_NAMES.values()}
        assert sorted(counts.values()) == [LONG_RUN_EVERY] * (len(counts) - 1) + [LONG_RUN_CALLS], counts
        for dtype, name in DTYPE_NAMES.items():
            [bucket] = [b for b in runner.scheduled(session, family, impl, dtype) if b.name == LONG_RUN]
            assert bucket.calls == counts[name] and bucket.label.endswith(f"({counts[name]} calls)")
        scoped = _session(normcert_session, tmp_path, seed, calls=LONG_RUN_CALLS, dtypes=("bfloat16",))
        assert schedule.rotated(scoped, impl, "served", LONG_RUN) == "bfloat16"
        assert schedule.long_run_calls(scoped, impl, "served", "bfloat16") == LONG_RUN_CALLS
    quick = _session(normcert_session, tmp_path, 0)
    assert {schedule.long_run_calls(quick, impl, "served", d) for d in DTYPE_NAMES.values()} == {QUICK_LONG_RUN}


SEEDS = range(10)


def test_the_ring_bug_is_killed_on_every_seed_naming_call_2049(normcert_session, tmp_path):
    for seed in SEEDS:
        session = _session(normcert_session, tmp_path, seed)
        impl = _impl(RingRms(zeroes=False))
        with pytest.raises(PropertyFailure, match=rf"call (\d+) of {QUICK_LONG_RUN} in a row on the same inputs") as e:
            _long_run_only(session, impl, torch.float32)
        res = session.results[-1]
        assert (res.outcome, res.calls) == ("fail", QUICK_LONG_RUN) and f"calls={QUICK_LONG_RUN}" in res.worst_where
        assert res.message.startswith("call ")  # not "nondeterministic": Hypothesis's replay met the same failure
        # the kernel is wrong from its call SLOTS + 1 on, where the slot it takes was last filled for
        # rows like these: the probes' calls before the long run (the op's sample) may have been
        before = impl.fn.calls - QUICK_LONG_RUN
        said = int(re.search(r"call (\d+) of", str(e.value)).group(1))
        assert SLOTS + 1 - before <= said <= SLOTS + 1, (said, before)


def test_the_twins_are_certified_by_the_served_family_stating_their_calls(normcert_session, tmp_path):
    """Each twin in a dtype its bug shows in (the per-dtype ring's in bfloat16): its row made its own
    long run and says so."""
    ran = [(RingRms(zeroes=True), torch.float32, QUICK_LONG_RUN),
           (DtypeRingRms(zeroes=True), torch.bfloat16, QUICK_LONG_RUN), (OutputRingRms(0), torch.float32, QUICK_LONG_RUN),
           (SampledRms(early=False), torch.float32, LONG_RUN_EVERY)]
    for kernel, dtype, calls in ran:
        session = _session(normcert_session, tmp_path, 0, calls=calls)
        res = runner.run_family(session, BY_NAME["served"], _impl(kernel), dtype, max_examples=3)
        assert res.outcome == "pass", (kernel.__name__, res.message)
        assert res.calls == calls and f"long run: {calls} calls in a row" in res.modes, res.modes
        assert f"long_run 2x8 ({calls} calls)" in res.domain
    assert ran[-1][0].calls >= LONG_RUN_EVERY > SAMPLE  # the twin took its sampling path in the long run


def test_the_per_dtype_ring_is_killed_in_bfloat16_naming_call_2049(normcert_session, tmp_path):
    session = _session(normcert_session, tmp_path, 0)
    kernel = DtypeRingRms(zeroes=False)
    impl = _impl(kernel)
    assert _long_run_only(session, impl, torch.float32).outcome == "pass"  # its float32 path keeps no ring
    with pytest.raises(PropertyFailure, match=rf"call (\d+) of {QUICK_LONG_RUN} in a row on the same inputs") as e:
        _long_run_only(session, impl, torch.bfloat16)
    before = kernel.calls[torch.bfloat16] - QUICK_LONG_RUN
    said = int(re.search(r"call (\d+) of", str(e.value)).group(1))
    assert SLOTS + 1 - before <= said <= SLOTS + 1, (said, before)
    res = session.results[-1]
    assert (res.dtype, res.outcome, res.calls) == ("bfloat16", "fail", QUICK_LONG_RUN)


@pytest.mark.parametrize("buffers", [3, 4])
def test_outputs_from_a_ring_of_persistent_buffers_are_rejected_naming_the_calls_sharing_storage(
        normcert_session, tmp_path, buffers):
    session = _session(normcert_session, tmp_path, 0)
    impl = _impl(OutputRingRms(buffers))
    with pytest.raises(PropertyFailure, match=rf"returned y of call (\d+) of {QUICK_LONG_RUN} in a row on the same "
                                                rf"inputs in the storage of call (\d+)'s y \(a buffer it reuses") as e:
        _long_run_only(session, impl, torch.float32)
    later, earlier = map(int, re.search(r"call (\d+) of .* call (\d+)'s", str(e.value)).groups())
    assert (earlier, later) == (1, buffers + 1), str(e.value)  # round robin: call 1's buffer again
    assert (session.results[-1].outcome, session.results[-1].calls) == ("fail", QUICK_LONG_RUN)


def test_one_call_in_5000_wrong_is_rejected_naming_the_call(normcert_session, tmp_path):
    session = _session(normcert_session, tmp_path, 0, calls=LONG_RUN_EVERY)
    kernel = SampledRms(early=True)
    impl = _impl(kernel)
    with pytest.raises(PropertyFailure, match=rf"call (\d+) of {LONG_RUN_EVERY} in a row on the same inputs \(its "
                                              rf"outputs' bits differ from call 1's\)") as e:
        _long_run_only(session, impl, torch.float32)
    before = kernel.calls - LONG_RUN_EVERY
    first_wrong = next(c for c in kernel.wrong if c > before) - before
    assert int(re.search(r"call (\d+) of", str(e.value)).group(1)) == first_wrong, (str(e.value), kernel.wrong, before)



class _Counting:
    """A correct rms_norm that counts its calls."""

    def __init__(self):
        self.calls = 0
        self.__name__ = "rms_counting"

    def __call__(self, x, weight, eps):
        self.calls += 1
        return rms_norm(x, weight, eps)


def _case(calls: int):
    """The served family's long-run case of rms_norm in float32 with ``calls`` calls: the first Hypothesis draws."""
    rec = oracle.OPS["rms_norm"]
    bucket = next(b for b in buckets(rec, spin=3, calls=calls) if b.name == LONG_RUN)
    seen = []

    @settings(max_examples=1, database=None, deadline=None)
    @given(case=BY_NAME["served"].cases("rms_norm", torch.float32, "cpu", bucket=bucket))
    def draw(case):
        seen.append(case)

    draw()
    return seen[0]


def test_the_run_makes_exactly_its_calls_in_chunks_and_a_replayed_failure_is_not_called_again(normcert_session, tmp_path):
    session = _session(normcert_session, tmp_path, 0)
    counting = _Counting()
    case = _case(2 * CHUNK + 5)
    assert case.params["calls"] == 2 * CHUNK + 5 and tuple(case.main.shape) == (2, 8)
    long_run(session, _impl(counting), case, Worst(), None)
    assert counting.calls == 2 * CHUNK + 5 and session.long_runs[_impl(counting).id].calls == 2 * CHUNK + 5

    ring = RingRms(zeroes=False)
    impl = _impl(ring)
    with pytest.raises(PropertyFailure, match=f"call {SLOTS + 1} of") as first:
        long_run(session, impl, _case(SLOTS + 1), Worst(), None)
    made = ring.calls
    with pytest.raises(PropertyFailure) as again:  # Hypothesis's replay of the failing case
        long_run(session, impl, _case(SLOTS + 1), Worst(), None)
    assert ring.calls == made == SLOTS + 1 and str(again.value) == str(first.value)


def test_under_triton_s_interpreter_the_long_run_is_scaled_and_says_so():
    rec = oracle.OPS["rms_norm"]
    interpreted = next(b for b in buckets(rec, spin=1, interpreted=True) if b.name == LONG_RUN)
    assert interpreted.calls == LONG_RUN_INTERPRETED < LONG_RUN_CALLS
    assert f"scaled from {LONG_RUN_CALLS}: Triton's interpreter" in interpreted.label
    full = next(b for b in buckets(rec, spin=1) if b.name == LONG_RUN)
    assert full.calls == LONG_RUN_CALLS and (full.rows, full.width) == (2, 8)
    quant = next(b for b in buckets(oracle.OPS["rms_norm_group_quant"], spin=1) if b.name == LONG_RUN)
    assert quant.width % oracle.OPS["rms_norm_group_quant"].width_multiple == 0


KERNELS = {  # the planted kernels as a user's module names them: (source, the row message a bug fails with)
    "ring": ("RingRms(zeroes=False)", r"call \d+ of \d+ in a row on the same inputs"),
    "ring-twin": ("RingRms(zeroes=True)", None),
    "dtype-ring": ("DtypeRingRms(zeroes=False)", r"call \d+ of \d+ in a row on the same inputs"),
    "dtype-ring-twin": ("DtypeRingRms(zeroes=True)", None),
    "output-ring-3": ("OutputRingRms(3)", r"returned y of call 4 of \d+ in a row on the same inputs in the storage of call 1's y"),
    "output-ring-4": ("OutputRingRms(4)", r"returned y of call 5 of \d+ in a row on the same inputs in the storage of call 1's y"),
    "output-fresh": ("OutputRingRms(0)", None),
    "sampled": ("SampledRms(early=True)", r"call \d+ of \d+ in a row on the same inputs \(its outputs' bits differ from call 1's\)"),
    "sampled-twin": ("SampledRms(early=False)", None),
}


EARLY_SAMPLE = r"nondeterministic: the same case gave another result when run again"  # the sampled bug, seen by a rerun


def _certify(tmp_path, kernel: str, *scope: str):
    """``normcert certify rms_norm=mykern:rms --property served`` (and ``scope``) in a folder outside
    the clone (its own pytest.ini), ``mykern.rms`` the planted kernel ``kernel``: its exit status,
    output and certificate."""
    source = Path(planted_long_run.__file__).read_text()
    (tmp_path / "mykern.py").write_text(f"{source}\n\nrms = {KERNELS[kernel][0]}\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    r = subprocess.run([sys.executable, "-m", "normcert", "certify", "rms_norm=mykern:rms", "--certificate", "c.json",
                        "--property", "served", *scope], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    return r.returncode, (r.stdout + r.stderr)[-3000:], json.loads((tmp_path / "c.json").read_text())


@pytest.mark.normcert_heavy  # a run of the command in a fresh process each, 2**16 + 3 x 8193 calls: the heavy tier
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_from_a_user_s_folder_certify_rejects_each_bug_naming_its_cause_and_certifies_each_twin(tmp_path, kernel):
    """The served family in every dtype: 2**16 calls in the one dtype the seed picks, 8193 in each
    other, every row that reached its long run stating its calls; each bug rejected naming its cause
    (the per-dtype ring in bfloat16 alone), each twin certified.

    Only the sampled kernel may be caught before a long run: its wrong call is the object's
    5000k-1-th over every dtype, and after the first dtype's failure the later rounds' calls are
    bounded by time, so in a later dtype that call can fall in a search's rerun of one case, which
    is then rejected as nondeterministic: the same defect, named as such, with no long run made."""
    code, out, cert = _certify(tmp_path, kernel)
    rows = {row["dtype"]: row for row in cert["results"] if row["property"] == "served"}
    early = {d for d, row in rows.items() if row["calls"] == 0}
    assert kernel == "sampled" or not early, out
    assert all(re.search(EARLY_SAMPLE, rows[d]["message"]) for d in early), out
    made = sorted(rows[d]["calls"] for d in rows if d not in early)
    if early:
        assert set(made) <= {LONG_RUN_EVERY, LONG_RUN_CALLS} and made.count(LONG_RUN_CALLS) <= 1, out
    else:
        assert made == [LONG_RUN_EVERY] * 3 + [LONG_RUN_CALLS], out
    assert all(f"long run: {rows[d]['calls']} calls in a row" in rows[d]["modes"] for d in rows if d not in early), out
    says = KERNELS[kernel][1]
    if says is None:
        assert code == 0 and cert["verdict"] == "certified", out
        return
    assert code == 1 and cert["verdict"] == "not certified", out
    failed = {d for d, row in rows.items() if row["outcome"] == "fail"}
    assert failed == ({"bfloat16"} if kernel == "dtype-ring" else set(rows)), out
    assert all(re.search(says, rows[d]["message"]) for d in failed - early), [rows[d]["message"] for d in failed]


@pytest.mark.normcert_heavy  # 2**16 calls in a fresh process each
@pytest.mark.parametrize("kernel", ["dtype-ring", "dtype-ring-twin"])
def test_a_bfloat16_scoped_run_makes_its_long_run_in_bfloat16(tmp_path, kernel):
    """``--dtype bfloat16``: the full 2**16 calls in bfloat16, the row saying so; the per-dtype ring
    rejected at its 2049th bfloat16 call (the served search's calls of two rows before the long run
    count), its twin certified."""
    code, out, cert = _certify(tmp_path, kernel, "--dtype", "bfloat16")
    [row] = [row for row in cert["results"] if row["property"] == "served"]
    assert row["dtype"] == "bfloat16" and row["calls"] == LONG_RUN_CALLS, out
    assert f"long run: {LONG_RUN_CALLS} calls in a row" in row["modes"], row["modes"]
    if kernel == "dtype-ring":
        assert code == 1 and re.search(rf"call \d+ of {LONG_RUN_CALLS} in a row on the same inputs", row["message"]), out
    else:
        assert code == 0 and cert["verdict"] == "certified", out


EVERY = tuple(DTYPE_NAMES.values())
BUGS = [(RingRms, dict(zeroes=False), ("float32", "bfloat16"), None, r"call \d+ of \d+ in a row on the same inputs"),
        (DtypeRingRms, dict(zeroes=False), EVERY, "bfloat16", r"call 20[0-4]\d of \d+ in a row on the same inputs"),
        (OutputRingRms, dict(buffers=3), ("float32", "bfloat16"), None,
         r"returned y of call 4 of \d+ .* in the storage of call 1's y"),
        (OutputRingRms, dict(buffers=4), ("float32", "bfloat16"), None,
         r"returned y of call 5 of \d+ .* in the storage of call 1's y"),
        (SampledRms, dict(early=True), ("float32", "bfloat16"), None,
         r"call \d+ of \d+ in a row on the same inputs \(its outputs' bits differ")]
"""(kernel, its bug's arguments, the dtypes tried, the one of them it shows in (None: every one), the
row's message)."""
TWINS = [(RingRms, dict(zeroes=True), "float32"), (DtypeRingRms, dict(zeroes=True), "bfloat16"),
         (OutputRingRms, dict(buffers=0), "float32"), (SampledRms, dict(early=False), "float32")]


def _calls(kind) -> int:
    return LONG_RUN_EVERY if kind is SampledRms else QUICK_LONG_RUN


@pytest.mark.normcert_heavy  # the bar, seeds 0-9: --normcert-meta-seeds 10
def test_every_long_run_bug_dies_in_its_dtypes_naming_its_cause_on_every_seed(normcert_session, tmp_path, request):
    """Under each of ``--normcert-meta-seeds`` seeds, the long-run bucket alone at QUICK_LONG_RUN
    calls (LONG_RUN_EVERY for the one-in-5000 kernel: ``normcert certify``'s 2**16 and 8193 are the
    user-folder tests'): each bug fails in the dtypes it shows in and no other of those tried,
    naming its cause (seeds 0-9: 17 min with the twins' test on the 2-core machine at a load of 14)."""
    for k in range(request.config.getoption("--normcert-meta-seeds")):
        for kind, given, tried, where, says in BUGS:
            session = _session(normcert_session, tmp_path, normcert_session.seed + k, calls=_calls(kind))
            impl = _impl(kind(**given))
            failed = set()
            for name in tried:
                try:
                    _long_run_only(session, impl, getattr(torch, name))
                except PropertyFailure as e:
                    failed.add(name)
                    assert re.search(says, session.results[-1].message), str(e)
            assert failed == ({where} if where else set(tried)), (k, impl.id, failed)


@pytest.mark.normcert_heavy  # the bar, seeds 0-9: --normcert-meta-seeds 10
def test_every_long_run_twin_passes_on_every_seed(normcert_session, tmp_path, request):
    """Under each of ``--normcert-meta-seeds`` seeds, each twin's long run passes in the dtype its bug
    shows in."""
    for k in range(request.config.getoption("--normcert-meta-seeds")):
        for kind, given, name in TWINS:
            session = _session(normcert_session, tmp_path, normcert_session.seed + k, calls=_calls(kind))
            assert _long_run_only(session, _impl(kind(**given)), getattr(torch, name)).outcome == "pass", (k, kind)


class _RaisesPast:
    """A correct rms_norm that raises from its call ``k`` + 1 on (a workspace it cannot grow)."""

    def __init__(self, k: int):
        self.k, self.calls = k, 0
        self.__name__ = "rms_raises_past"

    def __call__(self, x, weight, eps):
        self.calls += 1
        if self.calls > self.k:
            raise RuntimeError(f"workspace ring exhausted at call {self.calls}")
        return rms_norm(x, weight, eps)


def test_a_kernel_that_raises_late_fails_in_its_chunk_and_is_not_called_again(normcert_session, tmp_path):
    session = _session(normcert_session, tmp_path, 0)
    kernel = _RaisesPast(CHUNK + 10)
    impl = _impl(kernel)
    with pytest.raises(ContractViolation, match=f"long run, calls {CHUNK + 1} to {2 * CHUNK}.*exhausted at call {CHUNK + 11}"):
        long_run(session, impl, _case(3 * CHUNK), Worst(), None)
    assert session.long_runs[impl.id].calls == CHUNK + 11  # the calls it made: the row's ``calls``
    with pytest.raises(ContractViolation, match=f"exhausted at call {CHUNK + 11}"):
        long_run(session, impl, _case(3 * CHUNK), Worst(), None)
