"""Reducing a failing case to a small one that fails the same way (``reduce``).

The guarantee: the case ``reduce`` returns fails ``search.check`` with a failure of the same kind
(``failures.kind_of``: the same output failing the same way, or the same exception type raised at
the same place) as the case it was given, in the same dtype, for the same property; every case it
tries is a valid input of the op inside the kernel's declared domain (the same ranks, row lengths a
multiple of the domain's and the op's width multiple, at most its max_width); and it calls the check
at most ``budget`` times (times the family's ``tries``, where a failure shows by chance and each
smaller case is checked up to that many times) and begins no call past ``seconds`` (a kernel slow
on a large case: one case took 191 s to reduce by calls alone).  Where the budget was not spent, no
single step below still fails the same way on the case returned (a local minimum of these steps,
not the smallest failing case there is; for a failure by chance, with each step tried ``tries``
times).

The steps, tried in this order, each kept only where the candidate fails the same way, and the
list started again after each kept step:

    context    each field of the calling context put back to its family's as-tested value
    rows       the main tensor's first dim (and a mask's, which shares it) cut to the row of the
               failing element, to its first row, to its first or second half; one row to none
               (the empty batch, where another kind of failure often lives)
    rank       a leading dim of size 1 dropped (where the domain admits the lower rank)
    row        the row length halved (rounded down to the width step), keeping the window of
               columns that holds the failing element, else the one that holds its row's largest
               input (the element a shift or square overflows), else the first columns; then a half, a
               quarter or an eighth of the columns taken out, each in turn (of a gated norm's
               groups, the same part of every group: as many groups, each shorter)
    layout     every tensor made contiguous
    values     every float input rounded towards zero to a power of two, then to an integer (and
               a backward's dy, apart); a weight or bias set to its identity (ones, zeros)

A backward's case carries the dy it was checked with (``Case.cotangents``), cut with the rows and
output columns of the tensors: a failure that needs particular dy (a float16 product dy * up
that overflows) is reduced on the same values, not on a dy drawn afresh for each smaller shape.

A failure of another kind met on the way is kept (``Reduction.others``) for the search for distinct
failures (``runner._Search.others``), as Hypothesis's shrinker reports them.  What changed is said in ``case.notes["reduced"]``; a masked MoE op (``counts``) keeps its rows and
rank; a long run's case (``params["calls"]`` > 1) is not reduced (its check replays the first
failure rather than call the kernel again), nor is a large case (``params["limit"]``, the large
family's: its check remakes its rows on the device from the case's seed and bucket, and its tensors
may be of the meta device, too large to hold).
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, fields, replace

import torch

from ...oracle.kinds import KINDS

from ..families import BY_NAME
from ..evidence.replay import tested
from ..harness.measure import Worst
from ..harness.sandbox import KernelHung, first_line
from ..search.case import Case
from ..search.context import Context, choices
from ..search.fitting import fit, relayout
from .failures import kind_of

BUDGET = 64
"""The most check calls (each one kernel call, or its few, and the oracle) spent reducing one failure."""

SECONDS = 30.0
"""The time after which reducing one failure begins no further check call (the one under way ends)."""


@dataclass
class Reduction:
    """What ``reduce`` did: ``calls`` check calls, the ``steps`` kept (in words), whether the budget
    ran out first (``spent``), or why the case was not tried (``skipped``)."""

    calls: int = 0
    budget: int = BUDGET
    steps: tuple[str, ...] = ()
    spent: bool = False
    skipped: str = ""
    others: list = field(default_factory=list)  # (case, message, error) of each other kind of failure met

    @property
    def label(self) -> str:
        """How the reported case is named: "shrunk" only where it was reduced to a local minimum."""
        if self.skipped:
            return f"first failing case (not shrunk: {self.skipped})"
        if not self.steps:
            return ("first failing case (not shrunk: the reduction's budget was spent first)" if self.spent
                    else "first failing case (not shrunk: no smaller case fails the same way)")
        return (f"reduced case (not shown minimal: the reduction's budget of {self.budget} calls or {SECONDS:g} s was "
                f"spent, after {self.calls} calls)" if self.spent else "shrunk case")


def reduce(search, case: Case, message: str, kind: str, budget: int = BUDGET,
           seconds: float = SECONDS) -> tuple[Case, str, Reduction]:
    """The module docstring's reduction of ``case`` (failing ``search.check`` with ``message`` of
    ``kind``): the reduced case, its failure's message, and what was done."""
    if int(case.params.get("calls", 1)) > 1:
        return case, message, Reduction(skipped=f"a long run of {int(case.params['calls'])} calls in a row")
    if "limit" in case.params:
        return case, message, Reduction(skipped="a large case, its rows remade on the device past an offset limit")
    tries = BY_NAME[search.prop].tries if search.prop in BY_NAME else 1
    budget *= tries  # as many smaller cases as for a failure that shows every time
    done = Reduction(budget=budget)
    steps: list[str] = []
    tried: set = set()
    memo = {"parts": 2}  # the finest cut-out that held: the next pass starts there (as ddmin does)
    progress = True
    until = time.perf_counter() + seconds
    while progress and done.calls < budget:
        progress = False
        for step, candidate in _candidates(search, case, message, memo):
            key = _key(candidate)
            if key in tried:
                continue
            if done.calls >= budget or time.perf_counter() > until:
                done.spent = True
                break
            tried.add(key)
            said = None
            for _ in range(tries):  # a failure by chance: a smaller case is checked again before it counts as passing
                if done.calls >= budget:
                    break
                done.calls += 1
                said = _same(search, candidate, kind, done.others)
                if said is not None:
                    break
            if said is not None:
                case, message, progress = candidate, said, True
                steps.append(step)
                memo["parts"] = memo.get("cut", 2) if step.startswith("row length") else memo["parts"]
                break
    done.spent = done.spent or progress  # the last pass ended on a step kept: the next was never tried
    done.steps = tuple(steps)
    if steps:
        case.notes["reduced"] = "; ".join(_merged(steps)) + (" (budget spent)" if done.spent else "")
    return case, message, done


def _key(case: Case):
    """What tells two candidates apart: their tensors' shapes, strides and bits, scalars and context."""
    def bits(k, t):
        return (k, None) if t is None else (k, tuple(t.shape), tuple(t.stride()), torch.empty(t.shape, dtype=t.dtype)
                                            .copy_(t.detach()).reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")

    return (tuple(bits(k, t) for k, t in case.tensors.items()),
            tuple(bits(k, t) for k, t in (case.cotangents or {}).items()),
            repr(sorted(case.scalars.items())), case.context, case.config)


def _same(search, candidate: Case, kind: str, others: list | None = None) -> str | None:
    """The message of ``candidate``'s failure where it is one of ``kind``, else None; a failure of
    another kind is kept in ``others`` (the first of each kind), as Hypothesis's shrinker reports the
    distinct bugs it meets."""
    search.forcing.select(candidate.config)
    try:
        search.check(search.session, search.impl, candidate, Worst())
    except KernelHung:
        raise
    except AssertionError as e:
        said = first_line(e) or type(e).__name__
        if kind_of(e, said) == kind:
            return said + search.forcing.pruned_note()  # the config that ran, where the case's was pruned away (before select)
        if others is not None and all(kind_of(o, m) != kind_of(e, said) for _, m, o in others):
            others.append((candidate, said, e))
        return None
    except Exception:  # noqa: BLE001 - another outcome (a refusal, an error): not the same failure
        return None
    finally:
        search.forcing.select("")
    return None


def _candidates(search, case: Case, message: str, memo: dict):
    """(step in words, candidate) pairs from ``case``, in the module docstring's order."""
    yield from _contexts(search, case)
    rec = case.record
    main = case.main
    at = _failing_index(message)
    at = at if at is not None and len(at) == main.dim() else None
    if rec.counts is None and main.dim() >= 2:
        n0 = main.shape[0]
        cuts = [(at[0], at[0] + 1)] if at and 0 <= at[0] < n0 and n0 > 1 else []
        cuts += [(0, 1), (0, n0 // 2), (n0 // 2, n0)] if n0 > 1 else [(0, 0)]  # one row: the empty batch
        for a, b in dict.fromkeys(cuts):
            yield f"rows {n0} -> {b - a}", _along_rows(case, lambda t, a=a, b=b: t[a:b])
        if n0 == 1 and search.impl.domain.rank(main.dim() - 1) == main.dim() - 1:
            yield f"rank {main.dim()} -> {main.dim() - 1}", _along_rows(case, lambda t: t[0])
    elif rec.counts is None and main.dim() == 1 and search.impl.domain.rank(2) == 2:  # one row: the empty batch
        yield "rows 1 -> 0", _along_rows(case, lambda t: t.unsqueeze(0)[:0])
    yield from _halved(search, case, at, memo)
    if any(t is not None and not t.is_contiguous() for t in case.tensors.values()):
        yield "made contiguous", case.copy(tensors={k: None if t is None else t.contiguous()
                                                    for k, t in case.tensors.items()})
    yield from _cut_out(search, case, memo)
    yield from _simpler(case)


def _contexts(search, case: Case):
    """The case with its calling context put back to the as-tested one whole, then field by field to
    each value its family draws before the one it has (the as-tested value first, then the others in
    ``context.choices``' order: those Hypothesis shrinks towards)."""
    if search.prop not in BY_NAME or not BY_NAME[search.prop].contexts:
        return
    family = BY_NAME[search.prop]
    plain = tested(family)
    off = [f.name for f in fields(Context) if getattr(case.context, f.name) != getattr(plain, f.name)]
    if len(off) > 1:
        yield "context as tested", case.copy(context=plain)
    leaves = tuple(case.record.grads_in(case.tensors))
    for name in off:
        first = getattr(plain, name)
        order = (first,) + tuple(v for v in choices(name, leaves, family.backward) if v != first)
        now = getattr(case.context, name)
        for value in order[:order.index(now)] if now in order else order[:1]:
            yield f"context {name} {value}", case.copy(context=replace(case.context, **{name: value}))


def _failing_index(message: str) -> tuple[int, ...] | None:
    """The failing element's index a measured failure names (``y[0, 3, 27]: ...``), else None."""
    m = re.search(r"\w\[(\d+(?:, \d+)*)\]", message)
    return tuple(int(i) for i in m.group(1).split(", ")) if m else None


def _along_rows(case: Case, cut) -> Case:
    """``case`` with ``cut`` applied to every tensor that shares the main tensor's rows (a mask too,
    and a backward's dy)."""
    kinds = {a.name: KINDS[a.kind].shape for a in case.record.args}
    return case.copy(tensors={k: cut(t) if t is not None and kinds.get(k) in ("rows", "leading") else t
                              for k, t in case.tensors.items()},
                     cotangents=_each(case.cotangents, cut))


def _each(cotangents: dict | None, move) -> dict | None:
    """A case's dy (``Case.cotangents``), each moved alike (rows or output columns, as its outputs'),
    contiguous: the layout dy is handed over in is the calling context's (``Context.dy``), not a cut's."""
    return None if cotangents is None else {k: move(t).contiguous() for k, t in cotangents.items()}


def _row(search, case: Case) -> tuple[int, int, int]:
    """(n, step, m): the main tensor's row length, the least step of row lengths the kernel's domain
    admits (its width multiple, without its max width), and the output row's length."""
    rec = case.record
    n = case.main.shape[-1]
    step = replace(search.impl.domain, max_width=None).width(1, rec.halves, rec.width_multiple)
    return n, step, n // 2 if rec.halves else n


def _halved(search, case: Case, at: tuple[int, ...] | None, memo: dict):
    """The case with its row length halved, inside the kernel's declared domain (``fit``): the
    window of output columns holding the failing element's column brought to the front first (each
    row input and weight rotated alike: the same op on other, equally valid values), then the one
    holding the failing row's largest input (the element a shift or a square overflows, which is
    often not the one that comes out wrong), then the first columns."""
    rec = case.record
    if not case.main.dim():
        return
    n, step, m = _row(search, case)
    half = max(step, (n // 2) // step * step)
    if half >= n:
        return
    limit = min(half, search.impl.domain.max_width or half)
    domain = replace(search.impl.domain, max_width=limit)
    keep = limit // 2 if rec.halves else limit
    shifts = [c // max(keep, 1) * keep for c in (at[-1] if at else None, _peak_column(case, at, m))
              if c is not None and keep <= c < m]
    shifts = list(dict.fromkeys([*shifts, 0]))
    memo["cut"] = 2  # a halving kept: the cut-outs start again from halves
    for shift in shifts:
        moved = _rotated(case, shift) if shift else case
        out = fit(moved, domain)
        out.notes = dict(case.notes)  # fitted to the domain already: "reduced" says what changed
        kept = out.main.shape[-1] // 2 if rec.halves else out.main.shape[-1]  # fit keeps a row's first columns
        out.cotangents = _each(moved.cotangents, lambda t: t[..., :kept])
        yield f"row length {n} -> {limit}", out


def _peak_column(case: Case, at: tuple[int, ...] | None, m: int) -> int | None:
    """The output column of the largest |x| (NaN and inf counted largest) in the failing element's
    row (``at``, of the main tensor's rank, without its column), or in the whole main tensor where
    no element is named."""
    x = case.main
    row = x[at[:-1]] if at and all(0 <= i < d for i, d in zip(at[:-1], x.shape)) else x
    if not row.numel() or not row.is_floating_point():
        return None
    mag = row.detach().abs().double().nan_to_num(nan=math.inf).reshape(-1, x.shape[-1]).amax(0)
    return int(mag.argmax()) % m if m else None


def _cut_out(search, case: Case, memo: dict):
    """The case with a half, a quarter or an eighth of its output columns taken out, each in turn
    (``_without``), where the row length left is one the kernel's domain admits."""
    rec = case.record
    if not case.main.dim():
        return
    n, step, m = _row(search, case)
    group = next((a.name for a in rec.args if a.kind == "group_size" and case.scalars.get(a.name)), None)
    if group is not None:
        yield from _cut_out_of_groups(search, case, group, memo)
        return
    for parts in (p for p in (2, 4, 8) if p >= memo["parts"]):
        memo["cut"] = parts
        k = max(step // (2 if rec.halves else 1), m // parts // step * step)
        for first in range(0, m - k + 1, k):
            left = (m - k) * (2 if rec.halves else 1)
            if left and search.impl.domain.width(left, rec.halves, rec.width_multiple) == left:
                yield f"row length {n} -> {left}", _without(case, first, first + k)


def _cut_out_of_groups(search, case: Case, group: str, memo: dict):
    """A gated norm's case, its k groups of s columns each: a half, a quarter or an eighth of every
    group taken out, at the same place in each, each place in turn; k groups of fewer columns.
    (Halving the row keeps k groups only where k divides the new length: two groups of 141 halved
    are one group of 141, where a bug of groups shows on two groups of one.)"""
    rec = case.record
    n, size = case.main.shape[-1], case.scalars[group]
    k = n // size
    for parts in (p for p in (2, 4, 8) if p >= memo["parts"]):
        memo["cut"] = parts
        w = max(1, size // parts)
        if k * (size - w) < 1 or search.impl.domain.width(k * (size - w), rec.halves, rec.width_multiple) != k * (size - w):
            continue
        for first in range(0, size - w + 1, w):
            kept = torch.tensor([c for c in range(n) if not first <= c % size < first + w])
            out = _per_column(case, lambda t, dim, kept=kept: t.index_select(dim, kept.to(t.device)))
            yield f"group size {size} -> {size - w}", out.copy(scalars={**out.scalars, group: size - w})


def _without(case: Case, a: int, b: int) -> Case:
    """``case`` with output columns a:b taken out of every row input, weight, bias and matrix (a
    [gate | up] row loses them from both halves): the same op on fewer, equally valid values."""
    def drop(t, dim):
        n = t.shape[dim]
        return torch.cat([t.narrow(dim, 0, a), t.narrow(dim, b, n - b)], dim=dim)

    return _per_column(case, drop)


def _rotated(case: Case, shift: int) -> Case:
    """``case`` with output column ``shift`` made the first of every row input, weight, bias and matrix."""
    return _per_column(case, lambda t, dim: torch.roll(t, -shift, dims=dim))


def _per_column(case: Case, move) -> Case:
    """``case`` with ``move(t, dim)`` applied along every output-column dim of its row inputs (each
    half of a [gate | up] row alone), weights, biases and matrices (both dims), each laid out in
    memory as it was (``fitting.relayout``: a bug of transposed rows alone is still shown)."""
    rec = case.record
    kinds = {x.name: KINDS[x.kind].shape for x in rec.args}
    out = {}
    for k, t in case.tensors.items():
        shape = kinds.get(k)
        if t is None or shape not in ("rows", "vector", "matrix"):
            out[k] = t
        elif shape == "rows" and rec.halves:
            gate, up = t.chunk(2, dim=-1)
            out[k] = relayout(torch.cat([move(gate, -1), move(up, -1)], dim=-1), t)
        elif shape == "matrix":
            out[k] = relayout(move(move(t, -1), -2), t)
        else:
            out[k] = relayout(move(t, -1), t)
    return case.copy(tensors=out, cotangents=_each(case.cotangents, lambda t: move(t, -1)))


def _simpler(case: Case):
    """Simpler values: powers of two, integers (the inputs, then a backward's dy), identity weights."""
    kinds = {a.name: KINDS[a.kind] for a in case.record.args}
    floats = [k for k, t in case.tensors.items()
              if t is not None and t.is_floating_point() and t.element_size() >= 2
              and kinds.get(k) is not None and kinds[k].shape in ("rows", "vector", "matrix")]
    for step, simplify in (("values to powers of two", _power_of_two), ("values to integers", torch.round)):
        changed = {k: _exact(case.tensors[k], simplify) for k in floats}
        changed = {k: t for k, t in changed.items() if not torch.equal(t, case.tensors[k])}
        if changed:
            yield step, case.replace(**changed)
        dy = _each(case.cotangents, lambda t: _exact(t, simplify))
        if dy is not None and any(not torch.equal(t, case.cotangents[k]) for k, t in dy.items()):
            yield f"dy {step}", case.copy(cotangents=dy)
    for k in floats:
        kind = kinds[k]
        if kind.shape == "vector" and kind.identity is not None:
            t = case.tensors[k]
            if not torch.all(t == kind.identity):
                yield f"{k} to {kind.identity:g}s", case.replace(**{k: torch.full_like(t, kind.identity)})


def _exact(t: torch.Tensor, simplify) -> torch.Tensor:
    """``simplify`` of t's values (in float64; NaN and infinities kept) in t's own dtype and layout."""
    v = t.to(torch.float64)
    s = torch.where(torch.isfinite(v), simplify(v), v).to(t.dtype)
    out = torch.empty(0, dtype=t.dtype, device=t.device)  # t's storage copied: what surrounds its values kept
    out.set_(t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())
    return out.copy_(s)


def _power_of_two(v: torch.Tensor) -> torch.Tensor:
    """Each value rounded towards zero to a power of two (0 stays 0): representable wherever v is."""
    a = v.abs()
    p = torch.where(a > 0, torch.exp2(torch.floor(torch.log2(torch.where(a > 0, a, 1.0)))), 0.0)
    return torch.sign(v) * p


def _merged(steps: list[str]) -> list[str]:
    """The steps in words, runs of one kind ("rows 8 -> 4", "rows 4 -> 1") said once ("rows 8 -> 1")."""
    out: list[str] = []
    for s in steps:
        m = re.fullmatch(r"(.*) (\d+) -> (\d+)", s)
        prev = re.fullmatch(r"(.*) (\d+) -> (\d+)", out[-1]) if out else None
        if m and prev and prev.group(1) == m.group(1):
            out[-1] = f"{m.group(1)} {prev.group(2)} -> {m.group(3)}"
        elif s not in out:
            out.append(s)
    return out
