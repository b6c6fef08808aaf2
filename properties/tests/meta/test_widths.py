"""Widths past the buckets' blocks (issue 53, item 4): the "past" buckets hold B + k for every block B
of ``buckets.BLOCKS`` (k spun in [1, B), not only the +1 tails of ``ODD_WIDTHS``), the "model" bucket a
released model's row past 8192 (``buckets.MODEL_WIDTHS``), and the random search draws both.  A gated
activation's rows reach an MLP's widths (``oracle.ops.MLP_WIDTH``), past the random search's longest
row (``buckets.SEARCH_WIDTH``): its "model" bucket spins over those alone, so that each is run over
seeds (the planted one-block kernels ``silu_and_mul_one_block_of_8192``, ``swiglu_one_block_of_16384``
are ``@bucket_bug``s: ``test_meta`` kills them on every seed).

A forward-only rms_norm that sums rows past 8192 block by block and forgets the last partial block,
float64 declared unsupported (``planted.rms_drops_partial_block_past_8192``), is rejected by accuracy
on each of seeds 0-9 (seed 0 in the quick tier, 1-9 in the heavy one); its twin, the partial block
added, passes accuracy in each dtype of its domain.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from ....impls import make
from ....oracle import OPS
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner
from ...search.buckets import BLOCKS, MODEL_ROWS, MODEL_WIDTHS, SEARCH_WIDTH, buckets
from ...search.strategies import row_lengths

from . import planted

DOMAIN = ("bfloat16", "float16", "float32")  # the planted kernels' domain, lowest precision first


def _impl(fn):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted:{fn.__name__}")


def test_a_past_bucket_per_block_with_its_tail_spun():
    rec = OPS["rms_norm"]
    tails = {b: set() for b in BLOCKS}
    models = set()
    for spin in range(200):
        past = [x for x in buckets(rec, spin) if x.name == "past"]
        assert len(past) == len(BLOCKS)
        for b, x in zip(BLOCKS, past):
            assert b < x.width < 2 * b and x.note == f"{b} + {x.width - b}"
            tails[b].add(x.width - b)
        (model,) = [x for x in buckets(rec, spin) if x.name == "model"]
        assert model.rows == MODEL_ROWS
        models.add(model.width)
    assert all(len(t) > 50 and max(t) > b // 2 for b, t in tails.items())  # not the +1 tails alone
    assert models == {w for w in MODEL_WIDTHS if w <= rec.max_width}
    assert {9216, 12288, 14336, 14848, 16384} <= models


@pytest.mark.parametrize("op, searched", [("swiglu", SEARCH_WIDTH), ("geglu", SEARCH_WIDTH),
                                          ("silu_and_mul", SEARCH_WIDTH // 2), ("gelu_and_mul", SEARCH_WIDTH // 2),
                                          ("silu_and_mul_group_quant", SEARCH_WIDTH // 2)])
def test_an_activation_s_model_bucket_spins_over_the_mlp_widths_past_the_search(op, searched):
    """Over 200 spins, the model bucket is one row of each MLP width past the search's longest output
    row (``searched``: x's longest row, halved for a [gate | up] op), up to Llama-3.1 405B's 53,248,
    and a [gate | up] op's "long" and "past 8192 + k" rows reach past 8192 output columns."""
    rec, models = OPS[op], set()
    for spin in range(200):
        (model,) = [x for x in buckets(rec, spin) if x.name == "model"]
        assert model.rows == 1
        models.add(model.width)
    assert models == {w for w in MODEL_WIDTHS if searched < w <= 53248}
    assert {28672, 53248} <= models
    (long,) = [x for x in buckets(rec, 0) if x.name == "long"]
    assert long.width == 16384
    assert max(x.width for x in buckets(rec, 0) if x.name == "past") > 8192


def test_the_random_search_draws_model_widths_and_partial_blocks():
    seen = []

    @settings(max_examples=200, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(n=row_lengths())
    def draw(n):
        seen.append(n)

    draw()
    assert set(seen) & set(MODEL_WIDTHS) - {16384}
    partial = [n for n in seen if n > 8192 and n % 8192 and n not in MODEL_WIDTHS]
    assert len(set(partial)) > 3 and np.median([n - 8192 for n in partial]) > 64


SEEDS = [0] + [pytest.param(k, marks=pytest.mark.normcert_heavy) for k in range(1, 10)]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_dropped_partial_block_past_8192_is_rejected(seed, normcert_session, tmp_path):
    """On seed ``seed``, accuracy over the kernel's domain rejects it (no float64: its domain leaves it out)."""
    session = Session(device=normcert_session.device, seed=seed, failures_dir=str(tmp_path))
    impl = _impl(planted.rms_drops_partial_block_past_8192)
    assert not impl.domain.admits_dtype("float64")
    said = []
    for dtype in DOMAIN:
        try:
            runner.run_family(session, BY_NAME["accuracy"], impl, getattr(torch, dtype), shrink=False)
        except PropertyFailure as e:
            said.append(str(e))
            break
    assert said, f"survived accuracy on seed {seed}"
    assert "accuracy fails for rms_norm:rms_drops_partial_block_past_8192" in said[0]


def test_the_twin_adding_the_partial_block_passes(normcert_session, tmp_path):
    session = Session(device=normcert_session.device, seed=0, failures_dir=str(tmp_path))
    impl = _impl(planted.rms_blocks_of_8192)
    for dtype in DOMAIN:
        res = runner.run_family(session, BY_NAME["accuracy"], impl, getattr(torch, dtype))
        assert res.outcome == "pass", (dtype, res.message)
        assert "past 2x" in res.domain and "model 2x" in res.domain, res.domain
