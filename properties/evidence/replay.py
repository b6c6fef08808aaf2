"""Replay files: one failing case, self-contained, loadable without executing code.

A replay file is a NumPy ``.npz`` written and read with ``allow_pickle=False``:

    meta            uint8 array holding UTF-8 JSON (see ``FORMAT`` below)
    t_<name>        uint8 array: the raw bytes of the storage span a tensor views

``meta`` = {"format": "normcert-replay/1", "op", "property", "impl" ("OP=MODULE:ATTR"),
"agrees_with" (an agreement failure's other kernel, OP=MODULE:ATTR; absent otherwise), "device", "versions", "scalars", "params", "notes", "config" (an autotuned kernel's config by
content, "" for none), "context" (the calling context, ``search.context.Context`` as an object of its
fields; absent in older files: they replay as tested), "tensors": {name: {"dtype",
"shape", "stride", "offset"} or null}, "cotangents" (a backward's failure: the dy of each output it was checked
with, {output: tensor as above}, its bytes in member t_dy.<output>; absent in a forward's file and
in older files, which draw dy from the cot_seed param again), and, where the case failed a check of its outputs, "elements":
the failing output's per-element data (``oracle.assessment.worst_elements``: the top elements by
error / bound or by ulps apart, the failing row's values in a window; non-finite numbers as the
strings "inf", "-inf", "nan"), which the report's card draws; ``load`` does not read it}.  Tensors come back bit for bit with
their original strides (a sliced or transposed view stays one), on any device.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import zipfile

import numpy as np
import torch

from ... import oracle
from ...oracle.formats import BY_NAME, DTYPE_NAMES
from ...oracle.kinds import KINDS

from .. import families
from ..declared.conventions import CONVENTIONS, split
from ..families import CASE_CHECKS

from ..search.case import MAX_ELEMENTS, Case, extent
from ..search.context import AS_TESTED, TRAINING, Context, problem, stored
from . import replay_names as names
from .bounded_json import TooDeep, loads
from .certificate import finite_json, versions
from .files import UnsafePath, why_not_writable, write_atomic

FORMAT = "normcert-replay/1"
_OTHER = {"bool": torch.bool, "int32": torch.int32, "int64": torch.int64}  # a mask; a masked op's counts
_OTHER_NAMES = {d: k for k, d in _OTHER.items()}
DY = "dy."  # a backward's upstream gradient of output y is stored as the tensor "dy.y" (member t_dy.y)


class ReplayError(ValueError):
    """A replay file that cannot be used; the message names the file and the problem."""


def _span(t: torch.Tensor):
    """(bytes, offset, stride) of the smallest storage span holding every element of t."""
    if t.numel() == 0:
        return b"", 0, list(t.stride())
    base = torch.as_strided(t.detach(), (extent(t),), (1,), t.storage_offset()).cpu()
    raw = base.contiguous().view(torch.uint8).numpy().tobytes()
    return raw, 0, list(t.stride())


def save_failure(impl, prop: str, case: Case, directory: str, suffix: str = "") -> str:
    """Write ``case`` as a replay file in ``directory``; returns the command that replays it (naming
    the kernel with ``--impl`` where it is the user's, not the registry's: replay imports no module a
    file names unless told to, and the user named this one for the run that failed), or
    why it was not saved (a tensor past MAX_ELEMENTS, which ``load`` would refuse: ``--profile
    large`` cases, made again from the run's seed).  Its name is the cell's (op, kernel, property,
    dtype, then ``suffix``: "-2" for a cell's second distinct failure) and the first hex digits of
    the file's SHA-256 (``replay_names``): the same failure saves to the same file, and a later run's
    other failure never replaces the file an older certificate names."""
    for k, t in case.tensors.items():
        if t is not None and extent(t) > MAX_ELEMENTS:
            return (f"not saved: {k} spans {extent(t)} elements, past the {MAX_ELEMENTS} of a replay file; "
                    f"the same --seed and --profile make the same case again")
    os.makedirs(directory, exist_ok=True)
    arrays = {}

    def kept(k, t):
        if t is None:
            return None
        raw, off, stride = _span(t)
        arrays[f"t_{k}"] = np.frombuffer(raw, dtype=np.uint8)
        return {"dtype": _OTHER_NAMES.get(t.dtype) or DTYPE_NAMES[t.dtype], "shape": list(t.shape), "stride": stride,
                "offset": off}

    meta_t = {k: kept(k, t) for k, t in case.tensors.items()}
    dy = {} if case.cotangents is None else {"cotangents": {k: kept(DY + k, t) for k, t in case.cotangents.items()}}
    agrees = {"agrees_with": f"{impl.op}={impl.agrees_with.target}"} if impl.agrees_with is not None else {}
    meta = {"format": FORMAT, "op": case.op, "property": prop, "impl": f"{impl.op}={impl.target}", **agrees,
            "device": str(case.main.device), "versions": versions(), "scalars": case.scalars,
            "params": case.params, "notes": case.notes, "config": case.config, "context": case.context.as_dict(),
            "tensors": meta_t, **dy}
    if case.elements is not None:
        meta["elements"] = finite_json(case.elements)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    archive = io.BytesIO()
    np.savez(archive, **arrays)
    path = os.path.join(directory, names.name(names.cell(impl.op, impl.name, prop, DTYPE_NAMES[case.dtype], suffix),
                                              archive.getvalue()))
    problem = why_not_writable(path, "replay")  # the rule of every file normcert writes
    if problem:
        return f"not saved: {path} {problem}"
    try:  # a fresh name and a rename: a link planted at the name between the check and here is not written through
        write_atomic(path, archive.getvalue())
    except UnsafePath as e:
        return f"not saved: {e}"
    trust = f"--impl {shlex.quote(meta['impl'])} " if impl.backend == "plugin" else ""
    return f"normcert replay {trust}{shlex.quote(path)}"


MAX_META_BYTES = 1 << 20
_NPY_HEADER = 4096  # an .npy member is its raw bytes plus a header of at most this much


def _fail(path: str, problem: str):
    raise ReplayError(f"{path}: {problem}")


def _members(path: str) -> dict[str, int]:
    """Member name -> uncompressed size, read from the zip directory (no member is inflated)."""
    if not os.path.exists(path):
        _fail(path, "no such file")
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):
        _fail(path, "not a replay file (expected a .npz archive written by normcert)")
    try:
        with zipfile.ZipFile(path) as zf:
            names = [i.filename for i in zf.infolist()]
            sizes = {i.filename.removesuffix(".npy"): i.file_size for i in zf.infolist()}
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        _fail(path, f"not a readable replay file ({e})")
    if len(sizes) != len(names):  # "t_x" and "t_x.npy": the size checked would not be the member read
        _fail(path, "two members with one name (with and without .npy)")
    return sizes


def _int_list(path, k, field, value, *, minimum=None) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        _fail(path, f"tensor {k!r}: {field} must be a list of integers")
    if minimum is not None and any(v < minimum for v in value):
        _fail(path, f"tensor {k!r}: {field} {value} has an entry below {minimum}"
              + (" (negative strides are not replayable)" if field == "stride" else ""))
    return value


def _tensor_meta(path, k, m, sizes) -> tuple[torch.dtype, list, list, int, int]:
    """Validated (dtype, shape, stride, offset, span) of one tensor, before any byte is read."""
    if not isinstance(m, dict):
        _fail(path, f"tensor {k!r}: expected an object")
    if m.get("dtype") not in _OTHER and m.get("dtype") not in BY_NAME:
        _fail(path, f"tensor {k!r}: dtype {m.get('dtype')!r}, expected one of {', '.join(BY_NAME)}, "
              f"{', '.join(_OTHER)}")
    dtype = _OTHER[m["dtype"]] if m["dtype"] in _OTHER else BY_NAME[m["dtype"]]
    shape = _int_list(path, k, "shape", m.get("shape"), minimum=0)
    stride = _int_list(path, k, "stride", m.get("stride"), minimum=0)
    offset = m.get("offset")
    if len(stride) != len(shape) or not isinstance(offset, int) or offset < 0:
        _fail(path, f"tensor {k!r}: shape, stride and offset do not fit together")
    numel = int(np.prod(shape, dtype=object)) if shape else 1
    span = (offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride))) if numel else 0
    # an empty tensor of shape (2**40, 0) holds nothing, but an op's output over its rows would not
    dims_product = int(np.prod([max(n, 1) for n in shape], dtype=object)) if shape else 1
    if max(numel, span, dims_product) > MAX_ELEMENTS:
        _fail(path, f"tensor {k!r} declares {max(numel, span, dims_product)} elements, more than the {MAX_ELEMENTS} a "
              f"replay file may hold")
    stored = sizes.get(f"t_{k}")
    if stored is None:
        _fail(path, f"tensor {k!r} has no data member")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if stored > span * itemsize + _NPY_HEADER:
        _fail(path, f"tensor {k!r}: its member holds {stored} bytes, more than the {span * itemsize} it needs")
    if stored < span * itemsize:
        _fail(path, f"tensor {k!r} is truncated")
    return dtype, shape, stride, offset, span


def _check_meta(path: str, meta) -> None:
    if not isinstance(meta, dict):
        _fail(path, "metadata is not an object")
    if meta.get("format") != FORMAT:
        _fail(path, f"format {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("op") not in oracle.OPS:
        _fail(path, f"unknown op {meta.get('op')!r}")
    names = [f.name for f in CASE_CHECKS]
    if meta.get("property") not in names:
        _fail(path, f"unknown property {meta.get('property')!r}, expected one of {', '.join(names)}")
    family = families.BY_NAME[meta["property"]]
    if not family.applies(oracle.OPS[meta["op"]]):
        _fail(path, f"property {family.name!r} does not apply to {meta['op']}")
    if family.pair != ("agrees_with" in meta):
        _fail(path, f"'agrees_with' (a string OP=MODULE:ATTR) is given exactly for the {family.name} family's "
                    f"pair of kernels" if family.pair else f"'agrees_with' is not a field of a {family.name} failure")
    for field in ("impl", "agrees_with") if family.pair else ("impl",):
        wrong = kernel_problem(meta[field] if field in meta else None, meta["op"])
        if wrong:
            _fail(path, f"{field!r}: {wrong}")
    for field in ("scalars", "params", "notes", "tensors"):
        if not isinstance(meta.get(field), dict):
            _fail(path, f"{field!r} must be an object")
    rec = oracle.OPS[meta["op"]]
    leaves = tuple(k for k in rec.grads if isinstance(meta["tensors"].get(k), dict))
    wrong = problem(meta.get("context", tested(family).as_dict()), leaves)
    if wrong:
        _fail(path, f"context: {wrong}")
    if not isinstance(meta.get("config", ""), str):
        _fail(path, "'config' must be a string (an autotuned kernel's config, by content)")
    if set(meta["scalars"]) != set(rec.scalars):
        _fail(path, f"scalars {sorted(meta['scalars'])}, expected {sorted(rec.scalars)} for {meta['op']}")
    kinds = {a.name: KINDS[a.kind] for a in rec.args}
    for k, v in meta["scalars"].items():
        try:
            kinds[k].check(meta["op"], k, v, None)
        except ValueError as e:
            _fail(path, str(e))
    wanted = {p.name for p in family.params}
    for p in family.params:  # a param added after the file was written: its value before it existed
        if p.name not in meta["params"] and p.default is not None:
            meta["params"][p.name] = p.default
    if set(meta["params"]) != wanted:
        _fail(path, f"params {sorted(meta['params'])}, expected {sorted(wanted)} for property {family.name!r}")
    expected = set(rec.tensors)
    if set(meta["tensors"]) != expected:
        _fail(path, f"tensors {sorted(meta['tensors'])}, expected {sorted(expected)} for {meta['op']}")
    may_be_none = {a.name for a in rec.args if a.optional or kinds[a.name].may_be_none}
    for k, m in meta["tensors"].items():
        if m is None and k not in may_be_none:
            _fail(path, f"tensor {k!r} is null, and {meta['op']} needs it")
    if "cotangents" in meta:
        if not family.backward:
            _fail(path, f"'cotangents' is not a field of a {family.name} failure (it calls no backward)")
        if not isinstance(meta["cotangents"], dict) or set(meta["cotangents"]) != set(rec.outputs) or \
                not all(isinstance(m, dict) and m.get("dtype") in BY_NAME for m in meta["cotangents"].values()):
            _fail(path, f"'cotangents' must hold a float tensor for each output of {meta['op']} "
                        f"({', '.join(rec.outputs)})")


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def kernel_problem(value, op: str) -> str:
    """Why ``value`` (a file's "impl" or "agrees_with") does not name a kernel of ``op`` as
    OP=MODULE:ATTR[@CONVENTION]: OP the file's op, MODULE and ATTR dotted Python names, CONVENTION
    one of ``conventions.CONVENTIONS``; "" where it does.  A name goes into an import (replay's, a
    reproducer's) and a reproducer's text, so nothing else is one (a newline, a quote, a space)."""
    wanted = f"expected {op}=MODULE:ATTR or {op}=MODULE:ATTR@CONVENTION ({', '.join(CONVENTIONS)}) of Python names"
    if not isinstance(value, str):
        return f"{_short(value)}: {wanted}"
    named, sep, target = value.partition("=")
    base, convention = split(target)
    module, colon, attr = base.partition(":")
    if named != op or not (sep and colon and _dotted(module) and _dotted(attr)) or \
            (convention and convention not in CONVENTIONS):
        return f"{_short(value)}: {wanted}"
    return ""


def tested(family) -> Context:
    """The context a file without one replays in: its family's as-tested one."""
    return TRAINING if family.backward else AS_TESTED


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_case(path: str, meta: dict, case: Case) -> None:
    """The built case fits its op's signature (shapes, dtypes, rank) and its property's params."""
    try:
        case.record.check(case.oracle_args())
    except ValueError as e:
        _fail(path, str(e))
    x = case.main
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    family = families.BY_NAME[meta["property"]]
    for p in family.params:
        problem = p.problem(case.record, meta["params"][p.name], rows)
        if problem:
            _fail(path, f"param {p.name!r} = {_short(meta['params'][p.name])}: {problem}")
    n = x.shape[-1] // 2 if case.record.halves else x.shape[-1]  # an output row
    for k, t in (case.cotangents or {}).items():
        if tuple(t.shape) != (*x.shape[:-1], n):
            _fail(path, f"cotangent {k!r} has shape {tuple(t.shape)}, expected {(*x.shape[:-1], n)} (the output's)")


def load(path: str, device: str) -> tuple[dict, Case]:
    """(meta, case) from a replay file; ReplayError says, in one line, what is wrong with it.

    Validated before anything is built: the format, op, property (one that applies to the op),
    target, scalars (the op's, finite, eps and scale > 0, GELU's form one of two names), the
    property's params (``families.Param``: exactly its own), and every tensor's presence (null only
    where the op allows None), dtype (one of the four, or bool), shape, strides (no negative ones)
    and offset.  Each tensor may declare and store at most ``MAX_ELEMENTS`` elements, counting
    every dim as at least 1 (an empty (2**40, 0) tensor would have 2**40 rows of output); member
    sizes are read from the zip directory and checked before a member is inflated (two members
    with one name are refused), and only the members the metadata names are read.  Once built,
    the case must fit the op's signature (``Op.check``: shapes, dtypes, rank) and each param its
    kind (a row index below the case's rows).  A file named as ``save_failure`` names one must hash
    to its name and be a failure of the op and property its name says (``replay_names.mismatch``).
    """
    sizes = _members(path)
    if sizes.get("meta", MAX_META_BYTES + 1) > MAX_META_BYTES:
        _fail(path, "missing or oversized metadata")
    try:
        with np.load(path, allow_pickle=False) as z:
            try:
                meta = loads(bytes(z["meta"]).decode())
            except TooDeep as e:
                _fail(path, f"metadata nested too deeply ({e})")
            _check_meta(path, meta)
            layout = {k: _tensor_meta(path, k, m, sizes) for k, m in meta["tensors"].items() if m is not None}
            layout.update({DY + k: _tensor_meta(path, DY + k, m, sizes) for k, m in meta.get("cotangents", {}).items()})
            raw = {k: z[f"t_{k}"] for k in layout}
    except ReplayError:
        raise
    except (OSError, ValueError, KeyError, UnicodeDecodeError, zipfile.BadZipFile, EOFError) as e:
        _fail(path, f"not a readable replay file ({type(e).__name__}: {_short(str(e))})")
    tensors = {k: None for k, m in meta["tensors"].items() if m is None}
    for k, (dtype, shape, stride, offset, span) in layout.items():
        data = raw[k]
        if data.dtype != np.uint8 or data.ndim != 1 or data.size < span * torch.empty(0, dtype=dtype).element_size():
            _fail(path, f"tensor {k!r} is truncated")
        flat = torch.from_numpy(data.copy()).view(dtype) if data.size else torch.empty(0, dtype=dtype)
        flat = flat.to(device)
        tensors[k] = torch.as_strided(flat, shape, stride, offset) if span else flat[:0].reshape(shape)
    dy = {k[len(DY):]: tensors.pop(k) for k in list(tensors) if k.startswith(DY)} if "cotangents" in meta else None
    context = stored(meta.get("context", tested(families.BY_NAME[meta["property"]]).as_dict()))
    case = Case(meta["op"], tensors, dict(meta["scalars"]), dict(meta["notes"]), dict(meta["params"]),
                meta.get("config", ""), Context(**context), cotangents=dy)
    _check_case(path, meta, case)
    wrong = names.mismatch(path, names.digest(path), meta["op"], meta["property"])
    if wrong:
        _fail(path, f"not the failure its name says: {wrong}")
    return meta, case
