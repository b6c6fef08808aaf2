"""The argument kinds (``oracle.kinds``): each record's jobs agree with one another.

A kind's sample and its draws pass its own check, its conversion gives the oracle a
value of the right sort, and an argument cannot name a kind that does not exist or be
optional without an identity.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from ...oracle import OPS
from ...oracle.backends import BACKENDS
from ...oracle.kinds import KINDS
from ...oracle.record import Arg
from ..search.strategies import cases


def _op_with(kind: str):
    """The first op with an argument of ``kind`` (every kind is some op's: checked below)."""
    return next(rec for rec in OPS.values() if any(a.kind == kind for a in rec.args))


def test_every_kind_is_some_op_s():
    used = {a.kind for rec in OPS.values() for a in rec.args}
    assert used == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("main_dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_a_kind_s_sample_passes_its_check_and_converts(kind, main_dtype):
    rec = _op_with(kind)
    args = rec.sample(main_dtype, rows=3, width=8)
    x, n = args[rec.main], args[rec.main].shape[-1]
    k = KINDS[kind]
    for a in (a for a in rec.args if a.kind == kind):
        value = args[a.name]
        if value is None:
            assert k.may_be_none
        else:
            k.check(rec.name, a.name, value, x)
        converted = k.convert(BACKENDS["float64"], value, n)
        if k.shape in ("rows", "vector", "matrix"):
            assert np.asarray(converted).shape == tuple(value.shape)
        elif k.shape == "experts":  # counts: integers, one per expert (x.shape[:-2])
            assert converted.dtype == np.int64 and converted.shape == tuple(x.shape[:-2])
        elif k.tensor:
            assert converted is None or converted.dtype == bool
        else:
            assert isinstance(converted, (float, str, bool)) or converted is None and k.may_be_none


@pytest.mark.parametrize("kind", [k for k in KINDS.values() if k.identity is not None], ids=lambda k: k.name)
def test_an_optional_argument_given_as_none_is_its_identity(kind):
    converted = np.asarray(kind.convert(BACKENDS["float64"], None, 5))
    assert converted.shape == (5,) and (converted == kind.identity).all()


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_s_draws_pass_its_check(kind):
    rec = _op_with(kind)

    @settings(max_examples=15, deadline=None, database=None)
    @given(cases(rec.name, torch.float32, "cpu", max_elems=256, max_n=16))
    def drawn(case):
        args = case.oracle_args()
        x = args[rec.main]
        for a in (a for a in rec.args if a.kind == kind):
            value = args.get(a.name)
            if value is None:
                assert a.optional or KINDS[kind].may_be_none
            else:
                KINDS[kind].check(rec.name, a.name, value, x)
    drawn()


def test_an_argument_names_a_kind_that_exists():
    with pytest.raises(ValueError, match="Arg w: kind must be one of rows, stream, weight, .*got 'weights'"):
        Arg("w", "weights")


def test_only_a_kind_with_an_identity_may_be_optional():
    with pytest.raises(ValueError, match="Arg eps: a eps has no identity, so it cannot be optional"):
        Arg("eps", "eps", optional=True)
    assert Arg("bias", "bias", optional=True).optional
