"""Reported counterexamples are small (``run.reduce``): a planted bug that any short row shows is
reported on a case of at most 16 elements, whichever family found it (a random search, a bucket, a
calling context), its correct twin one line apart is certified, the replay file stores the reduced
case, "shrunk case" is said only of a case that was reduced, and a failing cell's coverage line
describes the cases that ran.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from ...evidence.replay import load, save_failure
from ...families import BY_NAME
from ...harness.measure import PropertyFailure, Worst
from ...harness.session import Session
from ...run import runner
from ...run.failures import kind_of
from ...run.reduce import BUDGET, Reduction, reduce
from ...search.case import Case
from ...search.fitting import relayout
from .expect import registered
from .planted import activations, gated_norm, layer_norms, rms_norms

SMALL = 16
"""The issue's bar: a bug any row of a few elements shows is reported on at most this many elements."""

CASES = [
    (rms_norms.rms_float64_in_float32, "accuracy", torch.float64),
    (rms_norms.rms_drops_last_column, "accuracy", torch.float32),
    # a bug that needs particular dy (dy * up past float16's max): 1,178 elements on seed 0 while each
    # smaller case drew a dy of its own
    (activations.geglu_backward_rounds_dy_up, "gradients", torch.float16),
    pytest.param(rms_norms.rms_float64_in_float32, "gradients", torch.float64, marks=pytest.mark.normcert_heavy),
    pytest.param(rms_norms.rms_float64_in_float32, "served", torch.float64, marks=pytest.mark.normcert_heavy),
    pytest.param(layer_norms.ln_one_pass, "accuracy", torch.float32, marks=pytest.mark.normcert_heavy),
    # a bucket bug: found by a scheduled bucket's case (lattice@1e4, 128 wide), reduced all the same
    pytest.param(layer_norms.ln_uncentred_backward, "gradients", torch.float32, marks=pytest.mark.normcert_heavy),
]


def _failing(fn, family, dtype, tmp_path):
    """The result, message and replayed case of ``family`` failing ``fn`` (seed 0)."""
    session = Session(seed=0, failures_dir=str(tmp_path))
    with pytest.raises(PropertyFailure) as e:
        runner.run_family(session, BY_NAME[family], registered(fn.normcert_planted.op, fn), dtype)
    res = session.results[-1]
    _, case = load(res.replay.split()[-1], "cpu")
    return res, str(e.value), case


@pytest.mark.parametrize("fn, family, in_dtype", CASES)
def test_a_bug_any_short_row_shows_is_reported_on_a_small_shrunk_case(fn, family, in_dtype, tmp_path):
    res, message, case = _failing(fn, family, in_dtype, tmp_path)
    assert res.outcome == "fail"
    assert "\n  shrunk case: " in message, message
    assert case.main.numel() <= SMALL, case.describe()
    assert "reduced" in case.notes and f"reduced={case.notes['reduced']}" in res.worst_where
    # the coverage line counts the cases that ran, the failing ones too (not "largest call 0 elements")
    assert "largest call 0 elements" not in res.domain and "rows <= 0" not in res.domain, res.domain


def test_the_correct_twin_one_line_apart_is_certified(tmp_path):
    session = Session(seed=0, failures_dir=str(tmp_path))
    twin = rms_norms.rms_weight_required
    assert runner.run_family(session, BY_NAME["accuracy"], registered("rms_norm", twin), torch.float64).outcome == "pass"


def _search(fn, family="accuracy"):
    session = Session(seed=0)
    impl = registered(fn.normcert_planted.op, fn)
    return SimpleNamespace(prop=family, check=BY_NAME[family].check, session=session, impl=impl,
                           forcing=session.forcing(impl))


def _fails(search, case):
    with pytest.raises(PropertyFailure) as e:
        search.check(search.session, search.impl, case, Worst())
    return str(e.value).split("\n")[0], kind_of(e.value, str(e.value).split("\n")[0])


def test_a_row_is_halved_keeping_its_largest_input_where_the_failure_is_named_elsewhere(tmp_path):
    """One-pass LayerNorm under a shift: its sum of squares overflows float32 through the row's
    largest input, while the element said to fail is another one.  The halving keeps the window of
    that input (``reduce._peak_column``); keeping only the failing element's window and the first
    columns, the case stayed at 14 elements on seed 0 (1,604 in the benchmark's run of the catalogue)."""
    res, message, case = _failing(layer_norms.ln_one_pass, "invariance", torch.float32, tmp_path)
    assert res.outcome == "fail" and case.main.numel() <= 2, (case.describe(), case.notes)


def test_the_reduced_case_fails_the_same_way_within_the_budget():
    search = _search(rms_norms.rms_float64_in_float32)
    wide = Case.sample("rms_norm", torch.float64, rows=4, width=64)
    message, kind = _fails(search, wide)
    small, said, done = reduce(search, wide, message, kind)
    assert small.main.numel() <= 2 and 0 < done.calls <= BUDGET and not done.spent
    assert done.label == "shrunk case" and small.notes["reduced"].startswith("rows 4 -> 1")
    again, same = _fails(search, small)
    assert same == kind and again == said


def test_a_bug_of_a_strided_layout_alone_is_reduced_keeping_the_layout():
    """The row length's steps (a window rotated to the front, columns cut out) keep each tensor's
    layout: a kernel wrong only on transposed rows (it reads the storage as contiguous) is reduced from
    2 x 64 to a row of 2 at a stride (a contiguous copy would not fail: the case stayed 64 long)."""
    search = _search(rms_norms.rms_ignores_strides)
    wide = Case.sample("rms_norm", torch.float32, rows=2, width=64)
    wide.tensors["x"] = relayout(wide.tensors["x"], torch.ones(64, 2).t())  # (2, 64), strides (1, 2)
    message, kind = _fails(search, wide)
    small, said, done = reduce(search, wide, message, kind)
    assert small.main.numel() <= 2 and not small.main.is_contiguous(), (small.describe(), done.steps)
    assert _fails(search, small) == (said, kind)


def test_a_bug_of_groups_is_reduced_keeping_its_groups():
    """A gated norm's row of two groups of 141 halved is one group of 141, where a kernel that ignores
    the groups is right: each group is cut instead (the same part of each), to two groups of one."""
    search = _search(gated_norm.gated_groups_ignored)
    wide = Case.sample("rms_norm_gated", torch.float32, rows=1, width=282)
    wide.scalars["group_size"] = 141
    wide.tensors["x"][0, 141:] *= 64  # the groups' statistics apart
    message, kind = _fails(search, wide)
    small, said, done = reduce(search, wide, message, kind)
    assert small.main.numel() <= 4 and small.main.shape[-1] // small.scalars["group_size"] == 2, (small.describe(), done.steps)
    assert _fails(search, small) == (said, kind)


def test_a_failure_by_chance_is_reduced_all_the_same():
    """A kernel whose sums race (a random order each call) differs between two calls on some shapes
    and not on others: each smaller case is checked up to the family's ``tries`` times, and a
    5,376-element row is reduced to a few elements (checked once each, it stayed at 5,376)."""
    rms_norms._RACES.manual_seed(0)
    search = _search(rms_norms.rms_nondeterministic, "determinism")
    wide = Case.sample("rms_norm", torch.float64, rows=4, width=5376)
    wide.tensors["x"] = torch.randn(4, 5376, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 10
    message, kind = _fails(search, wide)
    small, said, done = reduce(search, wide, message, kind)
    assert BY_NAME["determinism"].tries > 1 and done.budget == BUDGET * BY_NAME["determinism"].tries
    assert small.main.numel() <= SMALL, (small.describe(), done.steps)


def test_a_gradient_failure_is_reduced_and_replayed_on_the_dy_it_failed_on(tmp_path):
    """Liger's GeGLU backward rounds dy * up to float16: with up = 60000 and gate = 0.2, dgate is inf
    where dy > 65504 / 60000 and finite (exact 0.66 dy up) otherwise.  A 4 x 64 case failing at one
    element is reduced to that element with its own dy (a dy drawn afresh for each smaller shape, as
    before, keeps the failure only where the new draw passes 1.09 there), and its replay file keeps
    the dy: loaded, it fails the same way."""
    search = _search(activations.geglu_backward_rounds_dy_up, "gradients")
    wide = Case.sample("geglu", torch.float16, rows=4, width=64)
    wide.tensors["gate"] = torch.full((4, 64), 0.2, dtype=torch.float16)
    wide.tensors["up"][2, 37] = 60000.0
    dy = torch.rand(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.float16)  # in [0, 1): no overflow
    dy[2, 37] = 1.5
    wide.cotangents, wide.params["cot_seed"] = {"y": dy}, 0
    message, kind = _fails(search, wide)
    assert message.startswith("dgate[2, 37]: got inf"), message
    small, said, done = reduce(search, wide, message, kind)
    dy_up = small.cotangents["y"].double() * small.tensors["up"].double()  # simplified: 2 x 32768, say
    assert small.main.numel() == 1 and dy_up.abs().item() > 65504, (small.describe(), done.steps)
    assert _fails(search, small) == (said, kind)
    saved = save_failure(search.impl, "gradients", small, str(tmp_path))
    _, replayed = load(saved.split()[-1], "cpu")
    assert torch.equal(replayed.cotangents["y"], small.cotangents["y"]) and _fails(search, replayed) == (said, kind)


def test_a_case_cut_short_by_the_budget_says_so():
    search = _search(rms_norms.rms_float64_in_float32)
    wide = Case.sample("rms_norm", torch.float64, rows=4, width=64)
    message, kind = _fails(search, wide)
    cut, _, done = reduce(search, wide, message, kind, budget=2)
    assert done.calls == 2 and done.spent and done.steps
    assert "shrunk" not in done.label and "budget" in done.label and "(budget spent)" in cut.notes["reduced"]



def test_a_slow_kernel_s_reduction_stops_at_its_time_budget():
    """No check call begins past ``seconds``: a kernel taking 0.2 s a call is tried at most 3 times in 0.5 s."""
    search = _search(rms_norms.rms_float64_in_float32)
    wide = Case.sample("rms_norm", torch.float64, rows=4, width=64)
    message, kind = _fails(search, wide)
    check = search.check
    search.check = lambda *a: (time.sleep(0.2), check(*a))
    _, _, done = reduce(search, wide, message, kind, seconds=0.5)
    assert 1 <= done.calls <= 3 and done.spent and "or 30 s was spent" in done.label, (done.calls, done.label)

def test_a_case_no_step_reduces_is_not_called_shrunk():
    search = _search(rms_norms.rms_drops_last_column)
    one = Case("rms_norm", {"x": torch.ones(1), "weight": torch.ones(1)}, {"eps": 1e-5})
    message, kind = _fails(search, one)
    same, _, done = reduce(search, one, message, kind)
    assert same is one and not done.steps and "reduced" not in same.notes
    assert done.label == "first failing case (not shrunk: no smaller case fails the same way)"


def test_a_long_run_s_case_is_not_reduced():
    long = Case.sample("rms_norm", torch.float32, rows=4, width=64)
    long.params["calls"] = 257
    same, _, done = reduce(_search(rms_norms.rms_drops_last_column, "served"), long, "", "")
    assert same is long and done.calls == 0
    assert done.label == "first failing case (not shrunk: a long run of 257 calls in a row)"


def test_labels():
    assert Reduction(steps=("rows 4 -> 1",)).label == "shrunk case"
    assert Reduction(steps=(), spent=True).label.startswith("first failing case (not shrunk")
