"""Served: the kernel called the ways a serving engine calls it (``modes``), each call held to the
oracle under accuracy's bound.

For each case, every mode that applies (``modes.applicable``) calls the kernel once and its
outputs are checked against the oracle of the inputs it was given; a failure names the mode.  The
reused-buffer mode calls the kernel, writes -x into x's own storage (negation is exact in every
format), calls it again and checks the second result against the oracle of -x; x is put back
(negated again: bit for bit) whatever happens.  ``cuda graph`` captures the call on a GPU.
"""
from __future__ import annotations

import torch

from ... import oracle
from ..case import valid_positions
from ..measure import PropertyFailure, check_against_oracle
from ..modes import applicable
from ..sandbox import invoke
from .accuracy import accuracy_cases


def served_cases(op, dtype, device, bucket=None):
    """accuracy's cases: ordinary, lattice, offset and constant rows in every layout."""
    return accuracy_cases(op, dtype, device, bucket=bucket)


def check_served(session, impl, case, worst):
    modes, _ = applicable(session.device, case.dtype, trains(impl))
    where = valid_positions(case)
    for mode in modes:
        try:
            if mode.reuses:
                _reused(session, impl, case, worst, mode, where)
            elif mode.enter is None:
                continue  # cuda graph: ``_graph`` below, on a GPU
            else:
                outs = invoke(session, impl, case, within=lambda m=mode: m.enter(session.device), mode=mode.name)
                check_against_oracle(outs, case, worst, where=where)
        except PropertyFailure as e:
            raise PropertyFailure(f"called under {mode.name}: {e}") from None


def _reused(session, impl, case, worst, mode, where):
    """Two calls on the same storage, new values written in place between them."""
    within = lambda: mode.enter(session.device)  # noqa: E731
    invoke(session, impl, case, within=within, mode=mode.name)
    x = case.main
    with torch.no_grad():
        x.neg_()
    try:
        outs = invoke(session, impl, case, within=within, mode=mode.name)
        check_against_oracle(outs, case, worst, where=where)
    finally:
        with torch.no_grad():
            x.neg_()


def trains(impl) -> bool:
    """Is the kernel one a training step calls (its op has gradients, and it is not registered
    without a backward)?  Read from the records, not by calling the kernel."""
    return bool(oracle.OPS[impl.op].grads) and impl.backward is not False


def modes_ran(session, impl, dtype) -> str:
    """The result's words for the modes: those that ran, and why each other did not."""
    ran, skipped = applicable(session.device, dtype, trains(impl))
    text = "modes: " + ", ".join(m.name for m in ran if m.enter is not None or m.reuses)
    if skipped:
        text += "; not run: " + "; ".join(f"{k} ({v})" for k, v in skipped.items())
    return text
