"""Served: the kernel called the ways a serving engine calls it (``modes``), each call held to the
oracle under accuracy's bound.

For each case, every mode that applies (``modes.applicable``) calls the kernel once and its
outputs are checked against the oracle of the inputs it was given; a failure names the mode.  The
reused-buffer mode calls the kernel, writes -x into x's own storage (negation is exact in every
format), calls it again and checks the second result against the oracle of -x; x is put back
(negated again: bit for bit) whatever happens.  A mode with a ``backward`` (autocast) checks the
gradients of its call too, as the gradients family does, with the cotangents of the case's
``cot_seed``, on a kernel whose outputs carry a grad_fn (``probes.has_backward``; a forward-only
kernel's is the gradients family's verdict).  ``cuda graph`` captures the call on a GPU and
replays it on new values (``families.graphed``).  The ``long_run`` bucket's case
(``params["calls"]`` > 1) is called that many times in a row instead (``families.long_run``).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ..search.case import valid_positions
from ..harness.measure import PropertyFailure, check_against_oracle
from ..search.modes import applicable, calls, threads_of
from ..harness.calling import casting, held_to, trains
from ..harness.sandbox import invoke
from ..harness.probes import has_backward, inference_convention
from .accuracy import accuracy_cases
from .gradients import check_gradients
from .graphed import graphed
from .long_run import long_run


def served_cases(op, dtype, device, bucket=None):
    """accuracy's cases (ordinary, lattice, offset and constant rows in every layout), with a
    ``cot_seed`` for the gradients a backward mode checks: the case's own seed (no draw of its own,
    so the served family meets the same cases whether or not a mode checks gradients), and its
    ``calls``: 1 (one call under each mode), or the long-run bucket's count (``families.long_run``)."""
    count = bucket.calls if bucket is not None and bucket.calls else 1
    return accuracy_cases(op, dtype, device, bucket=bucket).map(lambda case: _with_params(case, count))


def _with_params(case, count: int):
    case.params["cot_seed"] = int(case.notes["seed"])
    case.params["calls"] = count
    return case


def check_served(session, impl, case, worst):
    where = valid_positions(case)
    if case.params.get("calls", 1) > 1:
        return long_run(session, impl, case, worst, where)
    for modes in calls(session.device, case.dtype, trains(impl)):
        name = " + ".join(m.name for m in modes)
        within = functools.partial(_entered, modes, session.device)
        try:
            if any(m.reuses for m in modes):
                _reused(session, impl, case, worst, within, name, where)
            elif any(m.graphs for m in modes):
                graphed(session, impl, case, worst, where)
            elif all(m.enter is not None for m in modes):
                outs = invoke(session, impl, case, within=within, mode=name,
                              cast=casting(impl, any(m.name == "autocast" for m in modes)))
                check_against_oracle(outs, held_to(case, outs), worst, where=where)
                if any(m.backward for m in modes) and _has_gradients(session, impl, case.dtype):
                    check_gradients(session, impl, case, worst, within=within, mode=name)
        except PropertyFailure as e:
            if threads_of(modes) is not None:  # the row records the threads of the call that failed
                case.notes["threads"] = threads_of(modes)
            raise PropertyFailure(f"called under {name}: {e}", units=e.units, ulps=e.ulps) from None


@contextlib.contextmanager
def _entered(modes, device):
    """Every mode of ``modes`` entered, in order (in the kernel's thread: ``sandbox.invoke``)."""
    with contextlib.ExitStack() as stack:
        for m in modes:
            stack.enter_context(m.enter(device))
        yield


def _reused(session, impl, case, worst, within, name, where):
    """Two calls on the same storage, new values written in place between them."""
    invoke(session, impl, case, within=within, mode=name)
    x = case.main
    with torch.no_grad():
        x.neg_()
    try:
        outs = invoke(session, impl, case, within=within, mode=name)
        check_against_oracle(outs, case, worst, where=where)
    finally:
        with torch.no_grad():
            x.neg_()


def _has_gradients(session, impl, dtype) -> bool:
    """Do the kernel's outputs carry a grad_fn (not forward only by its calling convention or its outputs)?"""
    return not inference_convention(session, impl) and has_backward(session, impl, dtype)


def modes_ran(session, impl, dtype) -> str:
    """The result's words for the modes: those that ran, and why each other did not."""
    ran, skipped = applicable(session.device, dtype, trains(impl))
    if impl.domain.capturable is False and any(m.graphs for m in ran):
        ran = [m for m in ran if not m.graphs]
        skipped = {**skipped, "cuda graph": "its domain declares capturable=no"}
    uncapturable = session.uncapturable.pop(impl.id, "")
    text = "modes: " + ", ".join(f"{m.name}: not capturable: {uncapturable}" if m.graphs and uncapturable
                                 else m.name for m in ran)
    if skipped:
        text += "; not run: " + "; ".join(f"{k} ({v})" for k, v in skipped.items())
    return text
