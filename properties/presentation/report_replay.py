"""What a failure card shows of its replay file: the case's metadata, the failing row of its input,
and the failing output's per-element data.

The replay file (``replay.py``: an ``.npz`` of raw tensor bytes and a JSON ``meta``) is read with
NumPy alone, ``allow_pickle=False``, and nothing of the kernel is run.  The input row shown is the
one holding the worst element that ``worst_where`` names ("y[3, 7]: ..." -> row 3 of the first
input of the output's shape), drawn as an SVG strip of bars (height: log10 |value|; colour: sign;
black: not finite) with the worst column marked.

The output's side is what the check measured when the case failed, kept in the file's
``meta["elements"]`` (``oracle.assessment.worst_elements``, with the error model's bound, error /
bound and ulps as ``assess`` computed them, against the exact value or, for a check of two calls,
the other call's output; for ``--agree``, the other kernel's value and the
steps of the format between the two): ``elements_view`` draws the failing row's window as a strip
of per-element error / bound (log scale, the bound 1 a line, the elements over it red; for an
agreement, ulps apart, the differing elements red) and lists the top elements in a table.  A
replay file written before that field existed shows the input alone.  A file that is missing,
foreign or damaged gives a one-line reason instead, never an exception.
"""
from __future__ import annotations

import math
import os
import re
import zipfile

import numpy as np

from ..evidence.bounded_json import loads
from ..evidence.replay_names import digest, mismatch

MAX_MEMBER_BYTES = 64 << 20
"""The largest member read (a replay file holds at most ``case.MAX_ELEMENTS`` elements a tensor)."""

MOST_TOP, MOST_SHOWN = 32, 1024
"""The most top elements and row elements a card reads from a file's per-element data (its writer,
``assessment.worst_elements``, keeps 8 and 256): a foreign file cannot make the page grow past them."""

BINS = 400
"""The most bars a strip draws; a longer row is binned, each bar its bin's largest |value|."""

DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16}

WORST = re.compile(r"^([^\n\[]*?)\[([0-9, ]+)\]:")


def worst_index(*texts: str) -> tuple[str, tuple[int, ...]] | None:
    """(output name, index) of the worst element the first of ``texts`` to name one names: a passing
    row's ``worst_where`` and a failing row's ``message`` open with it ("dx[56, 1]: ..." -> ("dx", (56, 1)))."""
    for text in texts:
        m = WORST.match(text or "")
        if m:
            return m.group(1).strip(), tuple(int(v) for v in m.group(2).split(","))
    return None


MAX_FILE_BYTES = 16 * MAX_MEMBER_BYTES
"""The largest replay file read whole (its bytes hashed: ``replay_names``)."""


def _check(path: str) -> dict[str, int]:
    """Refuse, before anything is inflated, a path that is not a plain .npz of sensible size; its
    members' uncompressed sizes by name (without ".npy"), from the zip directory."""
    if not os.path.isfile(path):
        raise ValueError("no such file")
    if not zipfile.is_zipfile(path):
        raise ValueError("not a replay file (.npz)")
    if os.path.getsize(path) > MAX_FILE_BYTES:
        raise ValueError("larger than a replay file is")
    with zipfile.ZipFile(path) as zf:
        if any(i.file_size > MAX_MEMBER_BYTES for i in zf.infolist()):
            raise ValueError("a member is larger than a replay file holds")
        return {i.filename.removesuffix(".npy"): i.file_size for i in zf.infolist()}


def _meta(z) -> dict:
    meta = loads(bytes(z["meta"]).decode())
    if not isinstance(meta, dict) or not isinstance(meta.get("tensors"), dict):
        raise ValueError("no tensor metadata")
    return meta


class Replays:
    """The replay files one page reads: each file is checked, hashed and its metadata parsed once,
    and each member read at most once, however many cards name it (a row of 20,000 failures naming
    one file once re-read it per card); a card's view of a file is made once per (file, row, case)."""

    def __init__(self):
        self.files: dict[str, dict] = {}
        self.views: dict[tuple, dict] = {}

    def file(self, path: str) -> dict:
        """{"sizes", "sha", "meta", "members": {}} of the file, or {"error"}: read on first use."""
        if path not in self.files:
            try:
                sizes = _check(path)
                sha = digest(path)
                with np.load(path, allow_pickle=False) as z:
                    self.files[path] = {"sizes": sizes, "sha": sha, "meta": _meta(z), "members": {}}
            except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as e:
                self.files[path] = {"error": f"the replay file could not be read ({type(e).__name__}: {str(e)[:120]})"}
        return self.files[path]

    def member(self, path: str, name: str) -> np.ndarray:
        """Member ``name`` of the file (read once)."""
        members = self.files[path]["members"]
        if name not in members:
            with np.load(path, allow_pickle=False) as z:
                members[name] = z[name]
        return members[name]


def values(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A tensor's stored bytes as float64 values (bfloat16 widened bit-exactly through float32)."""
    if dtype == "bfloat16":
        raw = raw[: raw.size // 2 * 2]
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype} is not drawn")
    item = np.dtype(DTYPES[dtype]).itemsize
    return raw[: raw.size // item * item].view(DTYPES[dtype]).astype(np.float64)


def _counts(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def failing_row(meta: dict, sizes: dict[str, int], read, index: tuple[int, ...]) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(tensor name, row index, values) of the first input whose shape holds ``index``'s row; ``read(member)``
    gives a member's array.  Each shape is checked against its member's stored size (``sizes``) before
    anything is read or allocated: a row that a file's metadata says is 10^15 wide is refused here."""
    for name, m in meta["tensors"].items():
        if not m or len(m.get("shape", [])) != len(index) or m.get("dtype") not in (*DTYPES, "bfloat16"):
            continue
        shape, stride, offset = m["shape"], m.get("stride"), m.get("offset")
        if not (_counts(shape) and _counts(stride) and _counts([offset]) and len(stride) == len(shape)):
            raise ValueError(f"tensor {name}: its shape, strides and offset are not counts that fit together")
        if any(i >= n for i, n in zip(index[:-1], shape[:-1])) or not shape[-1]:
            continue
        start = offset + sum(i * s for i, s in zip(index[:-1], stride[:-1]))
        last = start + (shape[-1] - 1) * stride[-1]
        stored = sizes.get(f"t_{name}", 0) // (2 if m["dtype"] == "bfloat16" else np.dtype(DTYPES[m["dtype"]]).itemsize)
        if last >= stored:
            raise ValueError(f"tensor {name}: its row reaches element {last}, past the {stored} its member stores")
        flat = values(read(f"t_{name}"), m["dtype"])
        at = start + np.arange(shape[-1]) * stride[-1]
        if at[-1] >= flat.size:
            raise ValueError(f"tensor {name} is truncated")
        return name, index[:-1], flat[at]
    raise ValueError("no input holds the worst element's row")


def strip(row: np.ndarray, column: int, width: int = 800, height: int = 60) -> dict:
    """The SVG bars of ``row``: one per element (or per bin of a long row), height by log10 |value|
    over the row's range (1 to 12 decades), red positive, blue negative, black not finite; ``column``'s bar
    is marked."""
    n = row.size
    per = max(1, math.ceil(n / BINS))
    bins = [row[k:k + per] for k in range(0, n, per)]
    finite = np.abs(row[np.isfinite(row) & (row != 0)])
    hi = math.log10(finite.max()) if finite.size else 0.0
    lo = min(max(math.log10(finite.min()) if finite.size else hi - 1, hi - 12), hi - 1)
    span = max(hi - lo, 1e-9)
    w = width / len(bins)
    bars = []
    for k, b in enumerate(bins):
        v = b[np.argmax(np.where(np.isfinite(b), np.abs(b), np.inf))]
        if not math.isfinite(v):
            frac, fill = 1.0, "#000"
        elif v == 0:
            frac, fill = 0.0, "#999"
        else:
            frac, fill = 0.08 + 0.92 * min(max((math.log10(abs(v)) - lo) / span, 0), 1), "#c0392b" if v > 0 else "#2c6db5"
        label = f"[{k * per}]" if per == 1 else f"[{k * per}..{min(n, (k + 1) * per) - 1}]"
        bars.append({"x": round(k * w, 2), "w": round(max(w - 0.3, 0.6), 2), "h": round(frac * height, 2),
                     "y": round(height - frac * height, 2), "fill": fill, "title": f"{label} = {v:.6g}"})
    mark = round((min(column, n - 1) // per + 0.5) * w, 2)
    return {"bars": bars, "width": width, "height": height, "mark": mark, "per": per, "n": n,
            "range": (f"1e{lo:.0f}", f"1e{hi:.0f}")}


def _number(value) -> float:
    """A stored number as a float ("inf", "-inf", "nan" as themselves); ValueError for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a number: {type(value).__name__}")
    return float(value)


def _digits(value: float, form: str) -> str:
    """A value of an output in enough digits to tell it from its neighbours in ``form``."""
    return f"{value:.17g}" if form == "float64" else f"{value:.9g}"


def _index(value) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ValueError("an index is not a list of counts")
    return tuple(value)


def error_strip(values: list[float], over: list[bool], column: int, agreement: bool, width: int = 800,
                height: int = 60) -> dict:
    """The SVG bars of a row's per-element error / bound (``agreement``: ulps apart), one per
    element: height on a log scale (error / bound from 1e-4 up, the bound 1 a dashed line; ulps
    from 1 up), red over the bound (differing), green within it, black where not finite;
    ``column`` (an index into ``values``) is marked."""
    finite = [v for v in values if math.isfinite(v) and v > 0]
    lo = 0.0 if agreement else -4.0
    hi = max(math.ceil(math.log10(max(finite))) if finite else 1, lo + 1, 1)
    n = max(len(values), 1)
    w = width / n
    bars = []
    for k, (v, bad) in enumerate(zip(values, over)):
        if not math.isfinite(v):
            frac, fill = 1.0, "#000"
        else:
            frac = 0.0 if v <= 0 else 0.06 + 0.94 * min(max((math.log10(v) - lo) / (hi - lo), 0), 1)
            fill = "#b3261e" if bad else "#2e8b57"
        bars.append({"x": round(k * w, 2), "w": round(max(w - 0.3, 0.6), 2), "h": round(max(frac, 0.02) * height, 2),
                     "y": round(height - max(frac, 0.02) * height, 2), "fill": fill, "k": k})
    bound = None if agreement else round(height - (0.06 + 0.94 * (0 - lo) / (hi - lo)) * height, 2)
    return {"bars": bars, "width": width, "height": height, "mark": round((min(column, n - 1) + 0.5) * w, 2),
            "bound": bound, "range": (f"1e{lo:.0f}", f"1e{hi:.0f}")}


def elements_view(elements) -> dict:
    """The card's view of a replay file's ``meta["elements"]``: {"kind", "output", "format",
    "index", "over", "checked", "top" (rows of strings), "row", "start", "stop", "length",
    "strip", "column"}; ValueError where the field is not what ``worst_elements`` writes."""
    if not isinstance(elements, dict) or elements.get("kind") not in ("oracle", "pair", "agreement"):
        raise ValueError("not per-element data")
    form, agreement = str(elements.get("format", "")), elements["kind"] == "agreement"
    top = []
    for t in list(elements.get("top", []))[:MOST_TOP]:
        if not isinstance(t, dict):
            raise ValueError("a top element is not an object")
        got, exact, bound, units, ulps = (_number(t.get(k)) for k in ("got", "exact", "bound", "units", "ulps"))
        top.append({"index": ", ".join(map(str, _index(t.get("index")))), "got": _digits(got, form),
                    "exact": _digits(exact, form), "bound": f"{bound:.3g}", "units": f"{units:.3g}",
                    "ulps": f"{ulps:.3g}", "over": t.get("over") is True})
    row = elements.get("row")
    if not isinstance(row, dict):
        raise ValueError("no failing row")
    cols = {k: [_number(v) for v in list(row.get(k, []))[:MOST_SHOWN]] for k in ("got", "exact", "bound", "units", "ulps")}
    over = [v is True for v in list(row.get("over", []))[:MOST_SHOWN]]
    shown = min(len(over), *(len(v) for v in cols.values()))
    start, length, at = _number(row.get("start", 0)), _number(row.get("length", 0)), _index(elements.get("index"))
    if not at or shown == 0:
        raise ValueError("no failing row")
    start, length = int(start), int(length)
    values = cols["ulps" if agreement else "units"][:shown]
    strip = error_strip(values, over[:shown], at[-1] - start, agreement)
    against = "reference" if elements["kind"] == "pair" else "exact"
    for b in strip["bars"]:
        k = b.pop("k")
        j = start + k
        b["title"] = (f"[{j}] this kernel {_digits(cols['got'][k], form)}, the other {_digits(cols['exact'][k], form)}: "
                      f"{cols['ulps'][k]:.3g} ulps apart" if agreement else
                      f"[{j}] got {_digits(cols['got'][k], form)}, {against} {_digits(cols['exact'][k], form)}: "
                      f"error / bound {cols['units'][k]:.3g}, {cols['ulps'][k]:.3g} ulps")
    return {"kind": elements["kind"], "against": against, "output": str(elements.get("output", "")), "format": form,
            "index": ", ".join(map(str, at)), "over": int(_number(elements.get("over", 0))),
            "checked": int(_number(elements.get("checked", 0))), "top": top,
            "row": ", ".join(map(str, at[:-1])), "start": start, "stop": start + shown - 1, "length": length,
            "column": at[-1], "strip": strip, "over_shown": sum(over[:shown])}


def replay_view(path: str, where: str, message: str, replays: Replays | None = None,
                cell: tuple[str, str, str, str] | None = None) -> dict:
    """The card's view of replay file ``path``: {"path", "error"} or {"path", "meta", "tensor", "row",
    "column", "strip", "near"} (``near``: the values around the worst column), with "elements"
    (``elements_view``) or "elements_error" where the file keeps the failing output's elements.
    ``cell`` (op, property, kernel, dtype) is the row that names the file: a file that is not that
    row's failure (``replay_names.mismatch``, or its metadata's op and property) is said, not drawn.
    ``replays``: the page's files, each read once (``Replays``)."""
    replays = replays if replays is not None else Replays()
    key = (path, where, message, cell)
    if key not in replays.views:
        replays.views[key] = _view(path, where, message, replays, cell)
    return replays.views[key]


def _view(path: str, where: str, message: str, replays: Replays, cell) -> dict:
    view: dict = {"path": path, "error": ""}
    read = replays.file(path)
    if "error" in read:
        return {**view, "error": read["error"]}
    meta = read["meta"]
    if cell is not None:
        op, prop, kernel, dtype = cell
        wrong = mismatch(path, read["sha"], op, prop, kernel, dtype)
        if not wrong and (meta.get("op"), meta.get("property")) != (op, prop):
            wrong = f"it holds a failure of {_plain(meta.get('op'))} {_plain(meta.get('property'))}, the row is {op} {prop}"
        if wrong:
            return {**view, "error": f"the replay file is not this row's failure: {wrong}; nothing of it is drawn"}
    try:
        view["meta"] = {k: meta.get(k) for k in ("op", "property", "impl", "device", "scalars", "params", "config")}
        view["tensors"] = [(k, m.get("dtype"), m.get("shape"), m.get("stride")) if m else (k, "None", "", "")
                           for k, m in meta["tensors"].items()]
        if "elements" in meta:
            try:
                view["elements"] = elements_view(meta["elements"])
            except (ValueError, TypeError, OverflowError) as e:
                view["elements_error"] = f"its per-element data could not be read ({str(e)[:120]})"
        found = worst_index(where, message)
        if found is None:
            view["error"] = "the certificate row names no worst element, so no input row is drawn"
            return view
        name, row, data = failing_row(meta, read["sizes"], lambda member: replays.member(path, member), found[1])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile, EOFError) as e:
        view["error"] = f"the replay file could not be read ({type(e).__name__}: {str(e)[:120]})"
        return view
    column = found[1][-1]
    lo, hi = max(column - 3, 0), min(column + 4, data.size)
    view.update(tensor=name, row=row, column=column, output=found[0], strip=strip(data, column),
                near=[(k, f"{data[k]:.6g}", k == column) for k in range(lo, hi)])
    return view


def _plain(value) -> str:
    return str(value)[:60]
