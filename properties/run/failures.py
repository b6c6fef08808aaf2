"""Telling a cell's failures apart (``kind_of``), and naming the smallest calling context a failing
case needs (``narrowed``)."""
from __future__ import annotations

import re
from dataclasses import fields, replace

from ..families import BY_NAME
from ..evidence.replay import tested
from ..harness.measure import Worst
from ..harness.sandbox import KernelHung, first_line
from ..search.context import Context


def kind_of(e: BaseException, message: str) -> str:
    """Which failure ``e`` (said as ``message``) is, for telling a cell's distinct failures apart: the
    raiser's own ``kind`` where it gives one (an output's name and whether its NaN pattern, an
    infinity or its error past the bound failed, ``Assessment.failure``; a kernel's exception type
    and the place it was raised, ``sandbox.kernel_code``), else its type and message with every
    number taken out (a shape or a value names the case, not the failure)."""
    return getattr(e, "kind", "") or f"{type(e).__name__}: " + re.sub(
        r"#(?:, #)+", "#", re.sub(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|\binf\b|\bnan\b", "#", message))


def narrowed(search, case, message: str, kind: str):
    """The failing ``case`` (its failure ``message`` of ``kind``) with each field of its context, in
    ``Context``'s order, put back to its family's as-tested value wherever the case still fails with
    a failure of the same kind there; and that failure's message.  Hypothesis shrinks a random
    search's context so already; a bucket's case is not shrunk (its shape is the bucket's), and
    this names the context its failure needs all the same: at most one call per field."""
    if search.prop not in BY_NAME or not BY_NAME[search.prop].contexts:
        return case, message
    plain = tested(BY_NAME[search.prop])
    for f in fields(Context):
        value = getattr(plain, f.name)
        if getattr(case.context, f.name) == value:
            continue
        candidate = case.copy(context=replace(case.context, **{f.name: value}))
        try:
            search.check(search.session, search.impl, candidate, Worst())
        except KernelHung:
            raise
        except AssertionError as e:
            said = first_line(e) or type(e).__name__
            if kind_of(e, said) == kind:
                case, message = candidate, said
        except Exception:  # noqa: BLE001 - another outcome (a refusal, an error): not the same failure
            pass
    return case, message
