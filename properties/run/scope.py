"""What a run checks: its tier's kernels (``tiered``), its declared scope's names (``--property``,
``--dtype``) and, in a shard's run (``--shard K/N``, ``evidence.shards``), which of the collected tests are its shard's."""
from __future__ import annotations

import pytest


def names(config, option: str, known) -> list[str] | None:
    """The names given with ``option`` (repeatable, comma-separated), checked against ``known``; None: all."""
    given = [n.strip() for v in config.getoption(option) for n in v.split(",") if n.strip()]
    for n in given:
        if n not in known:
            raise pytest.UsageError(f"{option} {n}: unknown, expected one of {', '.join(known)}")
    return sorted(set(given), key=list(known).index) or None


def check(item, family) -> str | None:
    """The check "kernel id property dtype" a test makes (gradcheck: in float64), or None for a test
    that runs no property family on a kernel (or none at all: an empty parameter set)."""
    from ...oracle.formats import DTYPE_NAMES  # noqa: PLC0415 - torch only in a run that collects

    params = getattr(getattr(item, "callspec", None), "params", {})
    impl = getattr(params.get("impl"), "id", None)
    dtype = DTYPE_NAMES.get(params["dtype"]) if "dtype" in params else "float64"
    if family is None or impl is None or dtype is None:
        return None
    return f"{impl} {family.name} {dtype}"


def in_shard(item, family, mine: set[str], every: set[str], first: bool) -> bool:
    """Does this shard run ``item``: its check is one of the shard's ``mine``, or, a test that is
    no check of the run's ``every`` (a kernel's support of some dtype), the ``first`` shard runs it."""
    made = check(item, family)
    return made in mine if made in every else first


TIERS = ("quick", "heavy", "all")


def tiered(registry: list, tier: str, device: str) -> list:
    """The registry's kernels a run of ``tier`` on ``device`` certifies.  On CPU the registry's Triton
    kernels run under Triton's interpreter, each program of the grid a Python loop: 40 % of a
    complete run's time on the 2-core machine (every family, dtype and bucket), so they are the
    heavy tier's, and the quick tier (the default ``pytest -n 2``) certifies the others.  On a GPU
    every kernel is the quick tier's.  ``.ci/run`` runs both tiers."""
    interpreted = [i for i in registry if i.backend == "triton" and device == "cpu"]
    if tier == "all":
        return registry
    if tier == "heavy":
        return interpreted
    return [i for i in registry if i not in interpreted]
