"""The long run: one small case called thousands of times in a row, as a serving loop calls a kernel.

A kernel may keep state from call to call: a step counter (an int16 one wraps at 2**15), a ring of
workspaces (2048 or 4096 slots, reused once it has gone round), a cache that fills up.  Such a
kernel is right for its first calls and wrong from some call k on, and the other families, which
make about a thousand calls in a whole run spread over every case, never reach k = 2049.  The
served family (``families.served``) therefore makes one long run per result, on the scheduled
``long_run`` bucket (``search.buckets``: a small case, LONG_RUN_ROWS x LONG_RUN_WIDTH):

    calls     n = ``case.params["calls"]``: LONG_RUN_CALLS = 2**16 (past a 2048- and a 4096-slot
              ring and an int16 counter's 2**15 - 1); at most LONG_RUN_INTERPRETED = 257 under
              Triton's interpreter, where every launch is a Python loop (the bucket's label
              says "257 calls, scaled from 65536"); the run's own count
              otherwise (``Session.long_run``: the clone's quick tier certifies the registry's
              kernels with fewer, ``run.plugin``)
    context   every call under ``torch.inference_mode()`` (a serving loop's), on the same input
              tensors a: y_i = f(a) for i = 1 .. n
    sandbox   the calls are made ``CHUNK`` at a time, each chunk one sandboxed call
              (``sandbox.kernel_code``: the watchdog, torch's state saved and restored), so a
              kernel that hangs at call k is still caught, and the per-call checks of ``invoke``
              (snapshot, contract, thread hand-off) are paid per chunk, not per call
    kept      y_i for i in ``spot_checks(n)``: 1, 2, 3, 2**k - 1, 2**k, 2**k + 1 for 2 <= k,
              and n, the last call, always
    checked   each kept y_i against the oracle of a under the bound accuracy uses
              (``measure.check_against_oracle``), in increasing i; the first that fails fails the
              result, naming i ("call 2049 of 65536 in a row").  An output bit for bit equal to one
              already checked is the same check and is not measured again.  The inputs must be
              unmutated after the n calls, and each kept output of the contract's shape, dtype and
              device.

The n calls are the kernel's, whatever comes after: a failing long run is not run again when
Hypothesis replays its failing case (a kernel wrong from call 2049 on would then be wrong from the
first call): its failure (the check's, or the kernel's contract violation in some chunk) is kept
on the session (``Session.long_runs``) until the result is recorded, and raised again.  The result's ``calls`` states n (0 where no long run ran), and its
``modes`` the long run's words (``said``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..harness.measure import PropertyFailure, check_against_oracle
from ..harness.sandbox import check_fresh, check_layouts, check_unmutated, kernel_code, shaped_outputs, snapshot

CHUNK = 1024  # calls per sandboxed call


@dataclass
class LongRun:
    """One result's long run: the ``calls`` it made, and its ``failure`` (None where it passed): a
    ``PropertyFailure``, or a ``ContractViolation`` of the kernel's."""

    calls: int
    failure: AssertionError | None = None


def spot_checks(n: int) -> list[int]:
    """The call indices (1-based) whose outputs are kept and checked: {1, 2, 3} and
    {2**k - 1, 2**k, 2**k + 1 : k >= 2} below n, and n."""
    spread = {1, 2, 3}
    k = 2
    while (1 << k) - 1 <= n:
        spread |= {(1 << k) - 1, 1 << k, (1 << k) + 1}
        k += 1
    return sorted(i for i in spread if i <= n) + ([] if n in spread else [n])


def long_run(session, impl, case, worst, where) -> None:
    """The module docstring's long run of ``case`` (``case.params["calls"]`` calls); PropertyFailure
    naming the first kept call whose output is outside the bound."""
    done = session.long_runs.get(impl.id)
    if done is not None and done.failure is not None:
        raise done.failure  # the same exception, from where it was first raised (Hypothesis's replay)
    n = int(case.params["calls"])
    session.long_runs[impl.id] = done = LongRun(n)
    try:
        _check(impl, case, worst, where, n, _calls(session, impl, case, n))
    except AssertionError as e:  # PropertyFailure, or the kernel's ContractViolation (a hang included)
        done.failure = e
        raise


def _calls(session, impl, case, n: int) -> dict[int, tuple]:
    """n calls of the kernel on ``case``'s inputs, CHUNK to a sandboxed call; the outputs of the
    ``spot_checks(n)`` calls, by index, as the contract's outputs."""
    keep = set(spot_checks(n))
    before = snapshot(case)
    args = case.oracle_args()
    kept: dict[int, object] = {}

    def chunk(first: int, last: int):
        def thunk():
            with torch.inference_mode():
                for i in range(first, last + 1):
                    out = case.record.call(impl.fn, args)
                    if i in keep:
                        kept[i] = _copied(out)
        return thunk

    key = (case.dtype, False, "long run")
    for first in range(1, n + 1, CHUNK):
        last = min(first + CHUNK - 1, n)
        kernel_code(session, impl, f" (long run, calls {first} to {last})", chunk(first, last), key)
    check_unmutated(impl, case, before)
    shaped = {}
    for i in sorted(kept):
        outs = shaped_outputs(impl, case, args, kept[i])
        check_layouts(impl, case, outs)
        check_fresh(impl, case, case.record.outputs, outs)
        shaped[i] = case.record.decode(outs, args)
    return shaped


def _copied(out):
    """The call's outputs as they are now (the kernel may write into a buffer it returned later on)."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if type(out) in (tuple, list):
        return type(out)(o.clone() if isinstance(o, torch.Tensor) else o for o in out)
    return out  # not what the contract asks for: ``shaped_outputs`` says so


def _check(impl, case, worst, where, n: int, kept: dict[int, tuple]) -> None:
    seen: list[tuple] = []
    for i, outs in kept.items():
        if any(len(s) == len(outs) and all(_same_bits(a, b) for a, b in zip(s, outs)) for s in seen):
            continue
        try:
            check_against_oracle(outs, case, worst, where=where)
        except PropertyFailure as e:
            raise PropertyFailure(f"call {i} of {n} in a row on the same inputs: {e}", kind=e.kind, units=e.units,
                                  ulps=e.ulps) from None
        seen.append(outs)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN payloads and signed zeros included), element by element."""
    return t.contiguous().flatten().view(torch.uint8)


def said(long_run: LongRun | None, there: str) -> str:
    """The result's words for its long run: the calls made, or in which dtype it ran this run
    (``there``; "" where it was to run here and did not: the search failed before it)."""
    if long_run is not None:
        return f"long run: {long_run.calls} calls in a row"
    return f"long run: in {there} this run" if there else "long run: not reached"
