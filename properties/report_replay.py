"""What a failure card shows of its replay file: the case's metadata and the failing row of its input.

The replay file (``replay.py``: an ``.npz`` of raw tensor bytes and a JSON ``meta``) is read with
NumPy alone, ``allow_pickle=False``, and nothing of the kernel is run: the report shows the inputs
the kernel was given, not its output, so the per-element error is not recomputed here.  The row
shown is the one holding the worst element that ``worst_where`` names ("y[3, 7]: ..." -> row 3 of
the first input of the output's shape), drawn as an SVG strip of bars (height: log10 |value|;
colour: sign; black: not finite) with the worst column marked.  A file that is missing, foreign or
damaged gives a one-line reason instead, never an exception.
"""
from __future__ import annotations

import json
import math
import os
import re
import zipfile

import numpy as np

MAX_MEMBER_BYTES = 64 << 20
"""The largest member read (a replay file holds at most ``case.MAX_ELEMENTS`` elements a tensor)."""

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


def _check(path: str) -> None:
    """Refuse, before anything is inflated, a path that is not a plain .npz of sensible size."""
    if not os.path.isfile(path):
        raise ValueError("no such file")
    if not zipfile.is_zipfile(path):
        raise ValueError("not a replay file (.npz)")
    with zipfile.ZipFile(path) as zf:
        if any(i.file_size > MAX_MEMBER_BYTES for i in zf.infolist()):
            raise ValueError("a member is larger than a replay file holds")


def _meta(z) -> dict:
    meta = json.loads(bytes(z["meta"]).decode())
    if not isinstance(meta, dict) or not isinstance(meta.get("tensors"), dict):
        raise ValueError("no tensor metadata")
    return meta


def values(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A tensor's stored bytes as float64 values (bfloat16 widened bit-exactly through float32)."""
    if dtype == "bfloat16":
        raw = raw[: raw.size // 2 * 2]
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype} is not drawn")
    item = np.dtype(DTYPES[dtype]).itemsize
    return raw[: raw.size // item * item].view(DTYPES[dtype]).astype(np.float64)


def failing_row(meta: dict, z, index: tuple[int, ...]) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(tensor name, row index, values) of the first input whose shape holds ``index``'s row."""
    for name, m in meta["tensors"].items():
        if not m or len(m.get("shape", [])) != len(index) or m.get("dtype") not in (*DTYPES, "bfloat16"):
            continue
        shape, stride, offset = m["shape"], m["stride"], m["offset"]
        if any(i >= n for i, n in zip(index[:-1], shape[:-1])) or not shape[-1]:
            continue
        flat = values(z[f"t_{name}"], m["dtype"])
        start = offset + sum(i * s for i, s in zip(index[:-1], stride[:-1]))
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


def replay_view(path: str, where: str, message: str) -> dict:
    """The card's view of replay file ``path``: {"path", "error"} or {"path", "meta", "tensor", "row",
    "column", "strip", "near"} (``near``: the values around the worst column)."""
    view: dict = {"path": path, "error": ""}
    try:
        _check(path)
        with np.load(path, allow_pickle=False) as z:
            meta = _meta(z)
            view["meta"] = {k: meta.get(k) for k in ("op", "property", "impl", "device", "scalars", "params", "config")}
            view["tensors"] = [(k, m.get("dtype"), m.get("shape"), m.get("stride")) if m else (k, "None", "", "")
                               for k, m in meta["tensors"].items()]
            found = worst_index(where, message)
            if found is None:
                view["error"] = "the certificate row names no worst element, so no input row is drawn"
                return view
            name, row, data = failing_row(meta, z, found[1])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile, EOFError) as e:
        view["error"] = f"the replay file could not be read ({type(e).__name__}: {str(e)[:120]})"
        return view
    column = found[1][-1]
    lo, hi = max(column - 3, 0), min(column + 4, data.size)
    view.update(tensor=name, row=row, column=column, output=found[0], strip=strip(data, column),
                near=[(k, f"{data[k]:.6g}", k == column) for k in range(lo, hi)])
    return view
