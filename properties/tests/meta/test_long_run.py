"""The long run (``families.long_run``) has teeth: a kernel right for its first 2048 calls and
wrong after (``planted_long_run``) is rejected on each of seeds 0-9 (``SEEDS``),
the failure naming call 2049; its twin, the same ring cleared before each reuse, is certified by
the served family with the calls stated; the run makes exactly its calls, keeps the spread ones,
and does not call again when Hypothesis replays its failing case.

The meta-test sessions make ``QUICK_LONG_RUN`` calls (past 2048 and 4096: about 0.3 s a run);
the full 2**16 is ``normcert certify``'s, checked from a user's folder in the heavy tier.
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
from ...families import BY_NAME
from ...families.long_run import CHUNK, long_run, spot_checks
from ...harness.measure import PropertyFailure, Worst
from ...harness.sandbox import ContractViolation
from ...harness.session import Session
from ...run import runner
from ...search.buckets import LONG_RUN, LONG_RUN_CALLS, LONG_RUN_INTERPRETED, QUICK_LONG_RUN, buckets
from .... import oracle

from . import planted_long_run
from .planted_long_run import SLOTS, RingRms


def _impl(fn):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted_long_run:{fn.__name__}")


def _session(normcert_session, tmp_path, seed):
    return Session(device=normcert_session.device, seed=seed, failures_dir=str(tmp_path), eager=normcert_session.eager,
                   long_run=QUICK_LONG_RUN)


def _long_run_only(session, impl, dtype):
    """The served family's run on its long-run bucket alone (no random search: its few calls add nothing)."""
    family = BY_NAME["served"]
    only = [(label, strat) for label, strat in
            [(b.label, family.cases(impl.op, dtype, session.device, bucket=b))
             for b in runner.scheduled(session, family, impl, dtype) if b.name == LONG_RUN]]
    assert len(only) == 1, "the long run is scheduled in the dtype ``rotated`` names"
    return runner.run(session, "served", impl, dtype, None, family.check, buckets=only, shrink=False)


def test_the_spot_checks_spread_over_the_powers_of_two_and_end_on_the_last_call():
    kept = spot_checks(LONG_RUN_CALLS)
    assert {1, 2, 3, 2047, 2048, 2049, 4095, 4096, 4097, 32767, 32768, 32769, 65535, 65536} <= set(kept)
    assert kept == sorted(set(kept)) and kept[-1] == LONG_RUN_CALLS and len(kept) < 3 * 17 + 1
    assert spot_checks(5) == [1, 2, 3, 4, 5] and spot_checks(4097)[-3:] == [4095, 4096, 4097]
    assert spot_checks(1000)[-1] == 1000


SEEDS = range(10)


def test_the_ring_bug_is_killed_on_every_seed_naming_call_2049(normcert_session, tmp_path):
    for seed in SEEDS:
        session = _session(normcert_session, tmp_path, seed)
        impl = _impl(RingRms(zeroes=False))
        dtype = getattr(torch, runner.rotated(session, impl, "served", LONG_RUN))
        with pytest.raises(PropertyFailure, match=rf"call (\d+) of {QUICK_LONG_RUN} in a row on the same inputs") as e:
            _long_run_only(session, impl, dtype)
        res = session.results[-1]
        assert (res.outcome, res.calls) == ("fail", QUICK_LONG_RUN) and f"calls={QUICK_LONG_RUN}" in res.worst_where
        assert res.message.startswith("call ")  # not "nondeterministic": Hypothesis's replay met the same failure
        # the kernel is wrong from its call SLOTS + 1 on, where the slot it takes was last filled for
        # rows like these: the probes' calls before the long run (the op's sample) may have been
        before = impl.fn.calls - QUICK_LONG_RUN
        said = int(re.search(r"call (\d+) of", str(e.value)).group(1))
        assert said in spot_checks(QUICK_LONG_RUN) and SLOTS + 1 - before <= said <= SLOTS + 1, (said, before)


def test_the_twin_is_certified_by_the_served_family_and_states_its_calls(normcert_session, tmp_path):
    session = _session(normcert_session, tmp_path, 0)
    impl = _impl(RingRms(zeroes=True))
    there = runner.rotated(session, impl, "served", LONG_RUN)
    ran = runner.run_family(session, BY_NAME["served"], impl, getattr(torch, there))
    assert ran.outcome == "pass"
    other = next(d for d in ("float32", "bfloat16") if d != there)  # one dtype per run: not scheduled here
    assert LONG_RUN not in {b.name for b in runner.scheduled(session, BY_NAME["served"], impl, getattr(torch, other))}
    elsewhere = runner.record(session, impl, "served", other, "pass")
    assert ran.calls == QUICK_LONG_RUN and f"long run: {QUICK_LONG_RUN} calls in a row" in ran.modes
    assert f"long_run 2x8 ({QUICK_LONG_RUN} calls)" in ran.domain
    assert elsewhere.calls == 0 and f"long run: in {there} this run" in elsewhere.modes


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


@pytest.mark.normcert_heavy  # two runs of the command in fresh processes, 2**16 calls each: the heavy tier
@pytest.mark.parametrize("zeroes", [False, True], ids=["ring-bug", "twin"])
def test_from_a_user_s_folder_certify_rejects_the_ring_and_certifies_its_twin_stating_the_calls(tmp_path, zeroes):
    """``normcert certify rms_norm=mykern:rms`` in a folder outside the clone (its own pytest.ini),
    the served family (the long run's) in every dtype: the full 2**16 calls in the one dtype the
    seed picks, the ring rejected at its 2049th call, the twin certified, the certificate stating them."""
    source = Path(planted_long_run.__file__).read_text()
    (tmp_path / "mykern.py").write_text(f"{source}\n\nrms = RingRms(zeroes={zeroes})\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    r = subprocess.run([sys.executable, "-m", "normcert", "certify", "rms_norm=mykern:rms", "--certificate", "c.json",
                        "--property", "served"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    cert = json.loads((tmp_path / "c.json").read_text())
    ran = [row for row in cert["results"] if row["calls"]]
    assert len(ran) == 1 and ran[0]["calls"] == LONG_RUN_CALLS, out[-3000:]
    assert f"long run: {LONG_RUN_CALLS} calls in a row" in ran[0]["modes"]
    if zeroes:
        assert r.returncode == 0 and cert["verdict"] == "certified", out[-3000:]
    else:
        assert r.returncode == 1 and cert["verdict"] == "not certified", out[-3000:]
        assert ran[0]["outcome"] == "fail" and re.search(r"call 20(47|48|49) of 65536 in a row", ran[0]["message"])


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
    with pytest.raises(ContractViolation, match=f"exhausted at call {CHUNK + 11}"):
        long_run(session, impl, _case(3 * CHUNK), Worst(), None)
    assert kernel.calls == CHUNK + 11
