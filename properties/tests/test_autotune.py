"""Autotuned Triton kernels under each of their configs (``normcert.properties.harness.autotune``).

Which autotuners a kernel reaches (and which it does not), configs recorded by content and
merged where the interpreter runs them as one computation, the plan that puts every config
of every tuner in some choice, and a forced run that reproduces what a GPU's autotuner does
around the config it picked: Triton's key and pruning, ``reset_to_zero`` once per new key, a
config's ``pre_hook`` on every call, ``restore_value`` / ``post_hook`` never (no benchmarking).
"""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from ..harness import autotune  # noqa: E402
from .meta import planted_tuned, planted_tuned_layout  # noqa: E402

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=4), triton.Config({"BLOCK": 16}, num_warps=8),
           triton.Config({"BLOCK": 64}, num_warps=4)]


@triton.jit
def _fill_body(Y, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        tl.store(Y + cols, tl.load(Y + cols, mask=cols < n, other=0.0) + BLOCK, mask=cols < n)


@triton.autotune(CONFIGS, key=["n"])
@triton.jit
def _plain(Y, n, BLOCK: tl.constexpr):
    _fill_body(Y, n, BLOCK)


@triton.heuristics({"UNUSED": lambda args: args["n"] % 2})
@triton.autotune(CONFIGS[:1] + CONFIGS[2:], key=["n"])
@triton.jit
def _under_heuristics(Y, n, UNUSED: tl.constexpr, BLOCK: tl.constexpr):
    _fill_body(Y, n, BLOCK)


@triton.autotune(CONFIGS, key=["n"])
@triton.heuristics({"UNUSED": lambda args: args["BLOCK"] // 16})
@triton.jit
def _over_heuristics(Y, n, UNUSED: tl.constexpr, BLOCK: tl.constexpr):
    _fill_body(Y, n, BLOCK)


@triton.autotune(CONFIGS, key=["n"])
@triton.jit
def _never_called(Y, n, BLOCK: tl.constexpr):
    _fill_body(Y, n, BLOCK)


def _small_blocks_only_for_short_rows(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] == 16 or named_args["n"] > 32]


@triton.autotune(CONFIGS, key=["n"], prune_configs_by={"early_config_prune": _small_blocks_only_for_short_rows})
@triton.jit
def _pruned(Y, n, BLOCK: tl.constexpr):
    _fill_body(Y, n, BLOCK)


PRE_HOOK_CALLS = []


@triton.autotune([triton.Config({"BLOCK": 16}, pre_hook=lambda nargs: PRE_HOOK_CALLS.append(nargs["n"])),
                  triton.Config({"BLOCK": 64})], key=["n"], reset_to_zero=["Y"], restore_value=["Y"])
@triton.jit
def _hooked(Y, n, BLOCK: tl.constexpr):
    _fill_body(Y, n, BLOCK)


def _launch(kernel, y):
    kernel[(1,)](y, y.numel())
    return y


def plain(y):
    return _launch(_plain, y)


def through_a_helper(y):
    return plain(y)


class _ViaAutograd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        return _launch(_over_heuristics, y)

    @staticmethod
    def backward(ctx, dy):
        return _launch(_under_heuristics, dy)


def via_autograd(y):
    return _ViaAutograd.apply(y)


applied = _ViaAutograd.apply  # as libraries export them: ``swiglu = SwiGLUFunction.apply``


def closure():
    kernel = _pruned

    def call(y):
        return _launch(kernel, y)
    return call


@pytest.fixture
def interpreted(normcert_session):
    return normcert_session.device == "cpu"


@pytest.mark.parametrize("kernel, found", [
    (plain, [_plain]),
    (through_a_helper, [_plain]),
    (via_autograd, [_over_heuristics, _under_heuristics.fn]),
    (applied, [_over_heuristics, _under_heuristics.fn]),
    (closure(), [_pruned]),
    (planted_tuned_layout.rms_norm_tuned_drops_tail, [planted_tuned._tuned_drops_tail]),  # lib.kernel[grid]
])
def test_a_kernel_s_autotuners_are_those_it_reaches(kernel, found):
    assert list(autotune.tuners(kernel)) == found
    assert all(t is not _never_called for t in autotune.tuners(kernel))


def test_configs_are_recorded_by_content_and_merged_where_the_interpreter_merges_them():
    assert [autotune.content(c, True).describe() for c in autotune.distinct(_plain, True)] == ["BLOCK=16", "BLOCK=64"]
    compiled = [autotune.content(c, False).describe() for c in autotune.distinct(_plain, False)]
    assert compiled == ["BLOCK=16, num_warps=4, num_stages=3, num_ctas=1",
                        "BLOCK=16, num_warps=8, num_stages=3, num_ctas=1",
                        "BLOCK=64, num_warps=4, num_stages=3, num_ctas=1"]


def test_every_config_of_every_tuner_is_in_some_choice():
    assert autotune.plan((_under_heuristics.fn, _plain), False) == ((0, 0), (1, 1), (0, 2))
    assert autotune.plan((), True) == ()


def test_a_forced_config_runs_and_is_recorded(normcert_session, interpreted):
    forcing = autotune.Forcing(autotune.tuners(plain), interpreted)
    seen, blocks = [], []
    for number in range(len(forcing.choices)):
        with forcing.under(number):
            seen.append(plain(torch.zeros(40, device=normcert_session.device))[0].item())
        blocks.append(dict(forcing.last.kwargs)["BLOCK"])
    assert seen == blocks and sorted(set(blocks)) == [16, 64]
    assert "run" not in vars(_plain)  # the autotuner is itself again


def test_a_config_pruned_away_for_a_key_is_not_run_for_it(normcert_session, interpreted):
    forcing = autotune.Forcing((_pruned,), interpreted)
    big = next(i for i, c in enumerate(forcing.choices) if dict(forcing.configs[0][c[0]].kwargs)["BLOCK"] == 64)
    with forcing.under(big):
        _launch(_pruned, torch.zeros(20, device=normcert_session.device))  # n <= 32: only BLOCK=16 allowed
        assert dict(forcing.last.kwargs)["BLOCK"] == 16
        _launch(_pruned, torch.zeros(40, device=normcert_session.device))
        assert dict(forcing.last.kwargs)["BLOCK"] == 64


def test_hooks_run_as_around_a_picked_config(normcert_session, interpreted):
    PRE_HOOK_CALLS.clear()
    forcing = autotune.Forcing((_hooked,), interpreted)
    small = next(i for i, c in enumerate(forcing.choices) if dict(forcing.configs[0][c[0]].kwargs)["BLOCK"] == 16)
    y = torch.full((20,), 100.0, device=normcert_session.device)
    with forcing.under(small):
        _launch(_hooked, y)  # a new key: reset_to_zero zeroes Y first, then the config's pre_hook
        assert y[0].item() == 16
        _launch(_hooked, y)  # the same key: no reset; restore_value never (nothing was benchmarked)
        assert y[0].item() == 32
        _launch(_hooked, torch.zeros(30, device=normcert_session.device))
    assert PRE_HOOK_CALLS == [20, 20, 30]


def test_the_planted_tail_bug_shows_under_its_small_block_config_only(normcert_session, interpreted):
    x = torch.randn(2, 40, device=normcert_session.device)
    w = torch.ones(40, device=normcert_session.device)
    right = planted_tuned.rms_norm_tuned
    wrong = planted_tuned.rms_norm_tuned_drops_tail
    forcing, reference = autotune.Forcing(autotune.tuners(wrong), interpreted), autotune.Forcing(
        autotune.tuners(right), interpreted)
    kept = []  # every output stays allocated: on a GPU the caching allocator would hand the wrong kernel's
    # output the block of the right one's last output, whose tail already holds the right values
    for number in range(len(forcing.choices)):
        with forcing.under(number), reference.under(number):
            kept += [wrong(x, w, 1e-5), right(x, w, 1e-5)]
        assert torch.equal(*kept[-2:]) == (dict(forcing.last.kwargs)["BLOCK"] != 32), forcing.describe(number)
