"""The run's tiers (``plugin.tiered``): the quick tier (the default ``pytest -n 2``) and the heavy
tier together certify every registry kernel, neither twice; on CPU the interpreted Triton kernels
are the heavy tier's, on a GPU every kernel is the quick tier's."""
from __future__ import annotations

from ..impls import registry
from .plugin import tiered


def test_the_tiers_split_the_registry():
    every = registry()
    quick, heavy = tiered(every, "quick", "cpu"), tiered(every, "heavy", "cpu")
    assert sorted(i.id for i in quick + heavy) == sorted(i.id for i in every)
    assert heavy and all(i.backend == "triton" for i in heavy)
    assert not any(i.backend == "triton" for i in quick)
    assert tiered(every, "all", "cpu") == every == tiered(every, "quick", "cuda")
    assert tiered(every, "heavy", "cuda") == []
