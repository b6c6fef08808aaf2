"""Fitting a drawn case into a kernel's declared domain (``properties.declared.domain``).

``fit(case, domain)`` is the case a kernel with that domain is checked on: the
same op, the same kind of values, moved inside the domain so that no draw is
wasted on what the kernel never claimed:

    rank      leading dims flattened (r -> k < r) or 1s prepended (k > r); a mask alike, and a
              masked MoE op's counts with x's expert dims (a rank-2 fit of it keeps expert 0)
    width     every row-length dim resized to ``domain.width(n)``: cut to its first n'
              entries, or tiled (the row repeated) to n' > n; a *_and_mul row is resized
              half by half, [gate[:n'/2] | up[:n'/2]]; a sublayer's n x n matrix in both dims;
              a gated norm's group_size (k groups of n / k) follows as n' / gcd(k, n'): the
              same number of groups where k divides n', fewer (longer) ones where it does not
    layout    a resized tensor keeps its kind of layout (contiguous, strided rows, transposed);
              under contiguous=last a tensor whose last dim is strided, under contiguous=all
              every non-contiguous tensor, is replaced by its contiguous copy
    params    weight, bias and a sublayer's bias cast to x's dtype (params=same) or float32 (a
              sublayer's matrix is always in x's dtype)
    residual  a residual stream cast to x's dtype (residual=same) or, for a float16 / bfloat16 x,
              float32 (residual=float32)
    weightless  no: a None weight or bias becomes its identity (``Case.with_identity``)
    unsupported  an option the kernel does not take (``unsupported=NAME``: ``oracle.record.Arg.option``,
              ``properties.declared.signature``) set to None, absent: a gated norm's case drawn with
              groups is the same tensors normalised over whole rows, an equally valid input
    flags     a flag argument the domain fixes (``flags=NAME:yes|no``) set to that value: the
              case is then the op's other form on the same tensors, an equally valid input
    values    an argument whose kind the domain restricts (``groups=``, ``layouts=``,
              ``block_formats=``: ``domain.ARG_KEYS``) set, where drawn outside them, to one of them
              (the k-th drawn value of the kind to the (k mod m)-th of the m allowed): the same
              tensors with a group size, scale layout or block format the kernel supports
    contract  a contract choice the domain declares (``nan=``, ``scale_floor=``, ``tail=``: ``domain.CONTRACT``)
              set on the op's argument of that kind (drawn as None, the default): the same input, judged by
              the oracle under the kernel's declared semantics
    mx_global_scale  taken: an MXFP4 case (drawn with global_scale 1, OCP MX's) given one of
              ``fp4.GLOBAL_SCALES`` other than 1, spun from the case's seed
    tail      tail=partial (``domain.Domain.width``: the op's group multiple no longer forced): a
              drawn row (a multiple of every group, the op's width_multiple) is cut short of a
              whole group, by 1 to group - 1 elements of its output row spun from the case's seed,
              in three cases of four (``_partial_width``): its last group is partial, its others
              whole; the fourth keeps its multiple (a kernel that counts one group too many on a
              whole row is still caught)

Every operation is exact on the values it keeps except a cast to a narrower dtype
(params=same, residual=same), which rounds: the case is then a different, equally valid input; the
oracle reads the fitted tensors.  ``case.notes["fitted"]`` says what changed.
"""
from __future__ import annotations

import math

import torch

from ..declared.domain import ARG_VALUES, Domain
from ...oracle.fp4 import GLOBAL_SCALES
from ...oracle.kinds import KINDS
from ...oracle.validate import stream_dtypes

from .case import Case
from .strategies import surround


def fit(case: Case, domain: Domain) -> Case:
    if not domain.declared:
        return case
    rec = case.record
    kinds = {a.name: KINDS[a.kind] for a in rec.args}
    changed = []
    if domain.weightless is False:  # first: the ones and zeros are then resized and cast as any weight
        filled = case.with_identity()
        if filled is not case:
            changed.append("None weight / bias given as ones / zeros")
            case = filled
    absent = [name for name in domain.unsupported or () if case.scalars.get(name) is not None]
    if absent:  # before the width: an option removed is not resized
        case = case.copy(scalars={**case.scalars, **dict.fromkeys(absent)})
        changed += [f"{name} -> None (not supported)" for name in absent]
    fixed = [(name, value) for name, value in domain.flags or () if case.scalars.get(name) is not value]
    if fixed:
        case = case.copy(scalars={**case.scalars, **dict(fixed)})
        changed += [f"{name} -> {value}" for name, value in fixed]
    moved = {}
    for a in rec.args:
        allowed = domain.allowed(a.kind)
        value = case.scalars.get(a.name)
        if allowed and value is not None and value not in allowed:
            moved[a.name] = allowed[_position(a.kind, value) % len(allowed)]
    if moved:
        case = case.copy(scalars={**case.scalars, **moved})
        changed += [f"{name} -> {value}" for name, value in moved.items()]
    declared = domain.choices()
    chosen = {a.name: declared[a.kind] for a in rec.args
              if a.kind in declared and case.scalars.get(a.name) != declared[a.kind]}
    if chosen:
        case = case.copy(scalars={**case.scalars, **chosen})
        changed += [f"{name} -> {value}" for name, value in chosen.items()]
    if domain.mx_global_scale == "taken" and case.scalars.get("block_format") == "mxfp4":
        g = GLOBAL_SCALES[2 + _spin(case) % (len(GLOBAL_SCALES) - 2)]  # one of those past the two 1s
        case = case.copy(scalars={**case.scalars, "global_scale": g})
        changed.append(f"global_scale -> {g} (mx_global_scale=taken)")
    t = dict(case.tensors)
    main = t[rec.main]

    r = main.dim()
    k = domain.rank(r)
    if k != r and rec.counts and k < r and k < 3:  # (experts..., tokens, n) to (tokens, n): expert 0
        for name, kind in kinds.items():
            if t.get(name) is not None and kind.shape in ("rows", "experts"):
                t[name] = t[name][(0,) * (r - k)]
        changed.append(f"rank {r} -> {k} (the first expert)")
    elif k != r:
        for name, kind in kinds.items():
            if t.get(name) is not None and kind.shape in ("rows", "leading", "experts"):
                lead = {"leading": 1, "experts": 2}.get(kind.shape, 0)  # a mask: x's leading dims; counts: its experts
                t[name] = _rerank(t[name], r - lead, k - lead)
        changed.append(f"rank {r} -> {k}")

    n = main.shape[-1]
    n2 = domain.width(_partial_width(case, n) if domain.tail == "partial" else n, rec.halves, rec.width_multiple)
    if n2 != n:
        for name, kind in kinds.items():
            v = t.get(name)
            if v is None:
                continue
            if kind.shape == "rows":
                t[name] = relayout(_halves(v, n2) if rec.halves else _resize(v, -1, n2), v)
            elif kind.shape == "vector":
                t[name] = relayout(_resize(v, -1, n2), v)
            elif kind.shape == "matrix":
                t[name] = relayout(_resize(_resize(v, -1, n2), -2, n2), v)
        changed.append(f"row length {n} -> {n2}")
        scalars = dict(case.scalars)
        for name, kind in kinds.items():
            size = scalars.get(name)
            if kind.name == "group_size" and size is not None:
                scalars[name] = n2 // math.gcd(n // size, n2) if n2 else None
                changed.append(f"{name} {size} -> {scalars[name]}")
        case = case.copy(scalars=scalars)

    if domain.contiguous is not None:
        moved = [name for name, v in t.items() if v is not None and not _allowed(v, domain.contiguous)]
        for name in moved:
            t[name] = t[name].contiguous()
        if moved:
            changed.append(f"made contiguous: {', '.join(moved)}")

    for want, which in ((_params_dtype(case, domain), lambda kind: kind.shape == "vector"),
                        (_stream_dtype(case, domain), lambda kind: kind.name == "stream")):
        cast = [name for name, kind in kinds.items() if which(kind) and t.get(name) is not None
                and want is not None and t[name].dtype != want]
        for name in cast:
            t[name] = t[name].to(want)
        if cast:
            changed.append(f"{', '.join(cast)} cast to {str(want).replace('torch.', '')}")

    out = case.copy(tensors=t)
    if changed:
        out.notes["fitted"] = "; ".join(changed)
    return out


PARTIAL_EVERY = 4  # under tail=partial, one fitted case in this many keeps its whole groups


def _position(kind: str, value) -> int:
    """value's index among its kind's values (``domain.allowed``'s order): 0 where it is not one."""
    values = list(ARG_VALUES[kind])
    return values.index(value) if value in values else 0


def _spin(case: Case) -> int:
    """The case's seed (its notes'), 1 where it has none."""
    try:
        return int(case.notes.get("seed", 1))
    except ValueError:
        return 1


def _partial_width(case: Case, n: int) -> int:
    """The row length n of a case of a per-group op cut for tail=partial (module docstring): its output
    row m (n, or n / 2 for a [gate | up] op) less 1 to group - 1 elements, spun from the case's
    seed, so that m mod group != 0 where group divides m; n itself for one seed in PARTIAL_EVERY, a
    group of 1, a row of one element, or a row the group does not divide: a case fitted already (the
    batches batch invariance refits) is not cut again, so fitting is idempotent."""
    rec = case.record
    group = next((case.scalars.get(a.name) for a in rec.args if a.kind == "group"), None)
    spin = _spin(case)
    m = n // 2 if rec.halves else n
    if not group or group < 2 or m <= 1 or m % group or spin % PARTIAL_EVERY == 0:
        return n
    cut = min(1 + spin // PARTIAL_EVERY % (group - 1), m - 1)
    return (m - cut) * (2 if rec.halves else 1)


def _params_dtype(case: Case, domain: Domain) -> torch.dtype | None:
    """The dtype the domain casts weights, biases and a sublayer's bias to (None: any)."""
    return None if domain.params is None else case.dtype if domain.params == "same" else torch.float32


def _stream_dtype(case: Case, domain: Domain) -> torch.dtype | None:
    """The dtype the domain casts a residual stream to (None: any): x's, or float32 where x's
    stream may be float32 (float16, bfloat16)."""
    if domain.residual is None:
        return None
    return stream_dtypes(case.dtype)[-1] if domain.residual == "float32" else case.dtype


def _rerank(t: torch.Tensor, r: int, k: int) -> torch.Tensor:
    """``t`` (leading dims first) with rank r made rank k: the first r - k + 1 dims flattened,
    or k - r leading 1s added.  A rank-0 mask (one position) stays as it is when k - r < 0 leaves it none."""
    if k > r:
        return t.reshape((1,) * (k - r) + tuple(t.shape))
    if r - k + 1 > t.dim():
        return t
    return t.flatten(0, r - k)


def _resize(t: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """``t`` with dim ``dim`` cut to its first n entries, or tiled (repeated) up to n."""
    have = t.shape[dim]
    if have >= n:
        return t.narrow(dim, 0, n)
    if have == 0:
        return torch.zeros(*t.shape[:dim % t.dim()], n, *t.shape[dim % t.dim() + 1:], dtype=t.dtype, device=t.device)
    reps = [1] * t.dim()
    reps[dim] = -(-n // have)
    return t.repeat(*reps).narrow(dim, 0, n)


def _halves(t: torch.Tensor, n: int) -> torch.Tensor:
    gate, up = t.chunk(2, dim=-1)
    return torch.cat([_resize(gate, -1, n // 2), _resize(up, -1, n // 2)], dim=-1)


def relayout(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``v``'s values in ``like``'s kind of layout: contiguous; rows at a stride past their length
    (3 more, as ``strategies.layout_tensor``'s "sliced"); or the last two dims transposed in memory.
    Where ``v`` fits inside ``like`` (its shape no larger in any dim), it is written into a copy of
    ``like``'s storage at ``like``'s strides and offset: the layout and what surrounds the values
    kept (a case cut narrower holds the memory it held); else the storage around the values is
    ``strategies.surround``'s, as in every layout the strategies make."""
    if like.is_contiguous() or v.dim() == 0:
        return v.contiguous()
    if (v.dim() == like.dim() and v.dtype == like.dtype and v.device == like.device and 0 not in like.stride()
            and all(a <= b for a, b in zip(v.shape, like.shape))):
        out = torch.empty(0, dtype=v.dtype, device=v.device)
        return out.set_(like.untyped_storage().clone(), like.storage_offset(), v.shape, like.stride()).copy_(v)
    if like.stride(-1) == 1:
        buf = surround((*v.shape[:-1], v.shape[-1] + 3), v.dtype, v.device)
        buf[..., : v.shape[-1]] = v
        return buf[..., : v.shape[-1]]
    if v.dim() >= 2:
        return v.transpose(-1, -2).contiguous().transpose(-1, -2)
    buf = surround((2 * v.shape[0],), v.dtype, v.device)  # a strided vector
    buf[::2] = v
    return buf[::2]


def _allowed(t: torch.Tensor, contiguous: str) -> bool:
    """Does ``t``'s layout meet ``contiguous``?  An empty tensor does (no element has a stride to
    step over, and ``contiguous()`` keeps its strides as they are)."""
    if contiguous == "all":
        return t.is_contiguous()
    return t.dim() == 0 or t.numel() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1
