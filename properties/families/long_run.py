"""The long run: one small case called thousands of times in a row, as a serving loop calls a kernel.

A kernel may keep state from call to call: a step counter (an int16 one wraps at 2**15), a ring of
workspaces (2048 or 4096 slots, reused once it has gone round, and kept per dtype), a cache that
fills up, a sampling path taken one call in thousands, a ring of output buffers handed out in turn.
Such a kernel is right for its first calls and wrong at or from some call k on, and the other
families, which make about a thousand calls in a whole run spread over every case, never reach
k = 2049.  The served family (``families.served``) therefore makes a long run in every dtype of
the run, on the scheduled ``long_run`` bucket (``search.buckets``: a small case, LONG_RUN_ROWS x
LONG_RUN_WIDTH):

    calls     n = ``case.params["calls"]`` (``schedule.long_run_calls``): LONG_RUN_CALLS = 2**16
              (past a 2048- and a 4096-slot ring and an int16 counter's 2**15 - 1) in one dtype
              of the kernel's domain and the run's scope, rotating with the seed, and
              LONG_RUN_EVERY = 8193 (past a 2048-, 4096- and 8192-slot ring and a one-in-5000
              call) in each other one: 2**16 calls in each of four dtypes would add three times
              the full count's cost (2**16 calls of the README's eager RMSNorm: about 1.7 s on the
              idle 2-core machine) to every certify, where 8193 add three eighths of it.  At most
              LONG_RUN_INTERPRETED = 257 in each dtype under Triton's interpreter, where every
              launch is a Python loop (the bucket's label says "257 calls, scaled from 65536");
              the run's own counts otherwise
              (``Session.long_run`` and ``long_run_every``: the clone's quick tier certifies the
              registry's kernels, which keep no state, with QUICK_LONG_RUN = 4097 and
              QUICK_LONG_RUN_EVERY = 257, ``run.plugin``)
    context   every call under ``torch.inference_mode()`` (a serving loop's), on the same input
              tensors a: y_i = f(a) for i = 1 .. n
    sandbox   the calls are made ``CHUNK`` at a time, each chunk one sandboxed call
              (``sandbox.kernel_code``: the watchdog, torch's state saved and restored), so a
              kernel that hangs at call k is still caught, and the per-call checks of ``invoke``
              (snapshot, contract, thread hand-off) are paid per chunk, not per call
    kept      every call's outputs, as the kernel returned them, alive until the n calls are
              checked, as a caller that keeps its results (embeddings of several batches) holds
              them: for the bucket's 2 x 8 case about 0.6 kB a call (the tensor objects, not their
              64 bytes of values, make most of it) and 0.15 kB for the checks' stacked bits: about
              50 MB at 2**16 calls of a one-output kernel, 6 MB at 8193, freed after each dtype's
              run, in the kernel's thread (a finalizer of the kernel's runs under the watchdog)
    checked   after the n calls: the inputs unmutated; call 1's outputs of the contract's shape,
              dtype, device and layout, and every other call's too (one whose outputs' dtype,
              shape, strides or device differ from call 1's is checked again and named); no
              output in the storage of an input, of another output of its call or of any other
              call's output (a ring of persistent output buffers: ``ContractViolation`` naming
              both calls); then every call's outputs compared bit for bit with call 1's (stacked:
              one comparison for the n calls), and call 1 and the first call of each other bit
              pattern held to the oracle of a under the bound accuracy uses
              (``measure.check_against_oracle``), in increasing call order; the first that fails
              fails the result, naming its call ("call 4999 of 65536 in a row on the same inputs").

The n calls are the kernel's, whatever comes after: a failing long run is not run again when
Hypothesis replays its failing case (a kernel wrong from call 2049 on would then be wrong from the
first call): its failure (the check's, or the kernel's contract violation in some chunk) is kept
on the session (``Session.long_runs``) until the result is recorded, and raised again.  Each
served result's ``calls`` states the calls its dtype's long run made (n, or those up to the one
that raised or hung; 0 where no long run ran), and its ``modes`` the long run's words (``said``).
A case fitted to a domain that holds no elements (every case of such a run is empty, and the run
is not-run) makes no calls: they would check nothing, at the price of 2**16 calls.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..harness.measure import PropertyFailure, check_against_oracle
from ..harness.sandbox import (ContractViolation, check_layouts, check_unmutated, kernel_code, plain, shaped_outputs,
                               snapshot)

CHUNK = 1024  # calls per sandboxed call


@dataclass
class LongRun:
    """One result's long run: the ``calls`` it made (those that returned, and one that raised or
    hung), and its ``failure`` (None where it passed): a ``PropertyFailure``, or a
    ``ContractViolation`` of the kernel's."""

    calls: int
    failure: AssertionError | None = None


def long_run(session, impl, case, worst, where) -> None:
    """The module docstring's long run of ``case`` (``case.params["calls"]`` calls); PropertyFailure
    naming the first call whose outputs are outside the bound, ContractViolation one whose outputs
    break the contract or share storage."""
    done = session.long_runs.get(impl.id)
    if done is not None and done.failure is not None:
        raise done.failure  # the same exception, from where it was first raised (Hypothesis's replay)
    if case.main.numel() == 0:  # fitted to a domain that holds no elements: its calls would check nothing
        session.long_runs[impl.id] = LongRun(0)
        return
    n = int(case.params["calls"])
    session.long_runs[impl.id] = done = LongRun(n)
    try:
        _run(session, impl, case, worst, where, done)
    except AssertionError as e:  # PropertyFailure, or the kernel's ContractViolation (a hang included)
        done.failure = e
        raise


def _run(session, impl, case, worst, where, done: LongRun) -> None:
    """``done.calls`` calls of the kernel on ``case``'s inputs, CHUNK to a sandboxed call, every
    return value held until all are checked, then freed in the kernel's thread; ``done.calls``
    the calls made, where one raised or hung."""
    n = done.calls
    before = snapshot(case)
    args = case.oracle_args()
    held: list = []
    key = (case.dtype, False, "long run")

    def calls(count: int):
        def thunk():
            with torch.inference_mode():
                for _ in range(count):
                    held.append(case.record.call(impl.fn, args))
        return thunk

    def free():
        kernel_code(session, impl, " (long run, its outputs freed)", held.clear, key)

    try:
        for first in range(1, n + 1, CHUNK):
            last = min(first + CHUNK - 1, n)
            try:
                kernel_code(session, impl, f" (long run, calls {first} to {last})", calls(last - first + 1), key)
            except BaseException:
                done.calls = len(held) + 1
                raise
        check_unmutated(impl, case, before)
        outs = _outputs(impl, case, args, held)
        _check_storage(impl, case, outs)
        _check_values(case, worst, where, args, outs)
    except BaseException:
        with contextlib.suppress(AssertionError):  # the first failure is the one said
            free()
        raise
    free()


def _outputs(impl, case, args, held: list) -> list[tuple]:
    """Each call's return value as the op's outputs (``sandbox.shaped_outputs``, ``check_layouts``):
    in full for call 1 and for a call whose outputs' dtype, shape, strides or device differ from
    its; ContractViolation naming the call."""
    n, count = len(held), len(case.record.outputs)
    outs, first = [], None
    for i, out in enumerate(held, 1):
        mine = _tensors(out, count)
        if first is None or mine is None or _signature(mine) != first:
            try:
                mine = shaped_outputs(impl, case, args, out)
                check_layouts(impl, case, mine)
            except ContractViolation as e:
                raise ContractViolation(f"call {i} of {n} in a row on the same inputs: {e}", kind=e.kind) from None
            first = _signature(mine) if first is None else first
        outs.append(mine)
    return outs


def _tensors(out, count: int) -> tuple | None:
    """``out`` as a tuple of ``count`` plain tensors, or None where it is not one."""
    mine = (out,) if count == 1 else tuple(out) if type(out) in (tuple, list) and len(out) == count else None
    return mine if mine is not None and all(plain(o) for o in mine) else None


def _signature(outs: tuple) -> tuple:
    return tuple((o.dtype, o.shape, o.stride(), o.device) for o in outs)


def _check_storage(impl, case, outs: list[tuple]) -> None:
    """No output in the storage of an input, of another output of its call, or of another call's
    output.  Every call's outputs are alive, so a fresh allocation can never have another's address:
    a shared storage is a buffer the kernel kept and handed out again (a ring of persistent output
    buffers), which overwrites a result its caller still holds."""
    n, names = len(outs), case.record.outputs
    owners: dict[int, tuple] = {t.untyped_storage().data_ptr(): (0, repr(k)) for k, t in case.tensors.items()
                                if t is not None and t.numel()}
    for i, call in enumerate(outs, 1):
        for name, o in zip(names, call):
            if not o.numel():
                continue
            j, other = owners.setdefault(o.untyped_storage().data_ptr(), (i, name))
            if (j, other) == (i, name):
                continue
            where = (f"the storage of its input {other}" if j == 0 else f"the storage of its {other}" if j == i
                     else f"the storage of call {j}'s {other} (a buffer it reuses: a caller that keeps call {j}'s "
                          f"result sees it overwritten; all {n} calls' outputs were held alive)")
            raise ContractViolation(f"{impl.id} returned {name} of call {i} of {n} in a row on the same inputs "
                                    f"in {where}", kind=f"{impl.id} long run: outputs share storage")


def _check_values(case, worst, where, args, outs: list[tuple]) -> None:
    """Every call's outputs bit for bit against call 1's; call 1 and the first call of each other
    bit pattern held to the oracle, in call order."""
    n = len(outs)
    bits = torch.cat([torch.stack([call[k] for call in outs]).reshape(n, -1).view(torch.uint8)
                      for k in range(len(outs[0]))], dim=1)
    differ = (bits != bits[0]).any(dim=1).nonzero().flatten()
    firsts = [0]
    if differ.numel():
        _, pattern = torch.unique(bits[differ], dim=0, return_inverse=True)
        first = torch.full((int(pattern.max()) + 1,), n, dtype=differ.dtype, device=differ.device)
        firsts += sorted(first.scatter_reduce(0, pattern, differ, "amin").tolist())
    for i in firsts:
        try:
            check_against_oracle(case.record.decode(outs[i], args), case, worst, where=where)
        except PropertyFailure as e:
            differs = " (its outputs' bits differ from call 1's)" if i else ""
            raise PropertyFailure(f"call {i + 1} of {n} in a row on the same inputs{differs}: {e}", kind=e.kind,
                                  units=e.units, ulps=e.ulps) from None


def said(long_run: LongRun | None) -> str:
    """The result's words for its long run: the calls made in its dtype ("not reached": the search
    failed before it, or the family has no long run for the kernel; "none": its case, fitted to the
    kernel's domain, held no elements, and no call was made)."""
    if long_run is None:
        return "long run: not reached"
    if long_run.calls == 0 and long_run.failure is None:
        return "long run: none (its case, fitted to the domain, holds no elements)"
    return f"long run: {long_run.calls} calls in a row"
