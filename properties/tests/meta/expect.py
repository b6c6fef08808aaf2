"""What the meta-tests expect of a planted kernel, said on the kernel itself.

As OpInfo's ``DecorateInfo`` states a test's expectation where the op is defined, each
planted kernel carries its verdict next to its code:

    @bug(op, *families)             a bug: at least one of ``families`` rejects it
                                    (``test_meta``: on the run's seed, in the first dtype that shows it)
    @bucket_bug(op, *families)      right except on a scheduled shape (``buckets.buckets``):
                                    each of ``families`` kills it on every seed
    @batch_size_bug(op, *families)  a row's bits change with the batch size: each of ``families``
                                    kills it on every seed under --bitwise
    @correct(op)                    correct: certified, every property in every dtype

``catalogue(module, role)`` lists a module's planted kernels of one role, in definition order;
``registered(op, fn)`` is a planted kernel as the registry takes it, with or without its declared domain.
The op and the family names are checked when the decorator is applied, so a typo fails at import.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from ....impls import make
from ....oracle import OPS
from ...declared.domain import Domain
from ...families import BY_NAME

ROLES = ("bug", "bucket_bug", "batch_size_bug", "correct")


@dataclass(frozen=True)
class Planted:
    op: str
    role: str
    families: frozenset[str]


def _declare(role: str) -> Callable:
    def declare(op: str, *families: str) -> Callable:
        if op not in OPS:
            raise ValueError(f"@{role}: op must be one of {', '.join(OPS)}, got {op!r}")
        unknown = [f for f in families if f not in BY_NAME]
        if unknown or (role == "correct") == bool(families):
            raise ValueError(f"@{role}({op!r}): families must be {'none' if role == 'correct' else 'some'} "
                             f"of {', '.join(BY_NAME)}, got {', '.join(families) or 'none'}")

        def mark(kernel: Callable) -> Callable:
            kernel.normcert_planted = Planted(op, role, frozenset(families))
            return kernel
        return mark
    declare.__name__ = role
    return declare


bug, bucket_bug, batch_size_bug, correct = (_declare(role) for role in ROLES)


def catalogue(module, role: str) -> list[tuple[str, Callable, set[str]]]:
    """The (op, kernel, families) of ``module``'s planted kernels declared with ``role``."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    found = []
    for value in vars(module).values():
        planted = getattr(value, "normcert_planted", None) if callable(value) else None
        if isinstance(planted, Planted) and planted.role == role:
            found.append((planted.op, value, set(planted.families)))
    return found


def registered(op: str, fn: Callable, declared: bool = True):
    """The planted kernel ``fn`` registered for ``op`` as a user's plugin: with the domain it declares,
    or (``declared=False``) with none, to show what its declaration changes."""
    impl = make(op, fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted:{fn.__name__}")
    return impl if declared else dataclasses.replace(impl, domain=Domain())
