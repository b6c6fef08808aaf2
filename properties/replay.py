"""Replay files: one failing case, self-contained, loadable without executing code.

A replay file is a NumPy ``.npz`` written and read with ``allow_pickle=False``:

    meta            uint8 array holding UTF-8 JSON (see ``FORMAT`` below)
    t_<name>        uint8 array: the raw bytes of the storage span a tensor views

``meta`` = {"format": "normcert-replay/1", "op", "property", "impl" ("OP=MODULE:ATTR"),
"device", "versions", "scalars", "params", "notes", "tensors": {name: {"dtype",
"shape", "stride", "offset"} or null}}.  Tensors come back bit for bit with
their original strides (a sliced or transposed view stays one), on any device.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shlex
import zipfile

import numpy as np
import torch

from normcert.oracle.formats import BY_NAME, DTYPE_NAMES

from . import CHECKS
from .opinfo import INFO, Case

FORMAT = "normcert-replay/1"
_BOOL = "bool"


class ReplayError(ValueError):
    """A replay file that cannot be used; the message names the file and the problem."""


def versions() -> dict:
    import hypothesis  # noqa: PLC0415

    out = {"python": platform.python_version(), "torch": torch.__version__, "hypothesis": hypothesis.__version__,
           "numpy": np.__version__}
    try:
        import triton  # noqa: PLC0415

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


def _span(t: torch.Tensor):
    """(bytes, offset, stride) of the smallest storage span holding every element of t."""
    if t.numel() == 0:
        return b"", 0, list(t.stride())
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    base = torch.as_strided(t.detach(), (extent,), (1,), t.storage_offset()).cpu()
    raw = base.contiguous().view(torch.uint8).numpy().tobytes()
    return raw, 0, list(t.stride())


def save_failure(impl, prop: str, case: Case, directory: str | None = None) -> str:
    """Write ``case`` as a replay file; returns the command that replays it."""
    from .harness import CONFIG  # noqa: PLC0415

    directory = directory or CONFIG["failures_dir"]
    os.makedirs(directory, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{impl.op}-{impl.name}-{prop}-{DTYPE_NAMES[case.dtype]}") + ".npz"
    path = os.path.join(directory, name)
    arrays, meta_t = {}, {}
    for k, t in case.tensors.items():
        if t is None:
            meta_t[k] = None
            continue
        raw, off, stride = _span(t)
        arrays[f"t_{k}"] = np.frombuffer(raw, dtype=np.uint8)
        meta_t[k] = {"dtype": _BOOL if t.dtype == torch.bool else DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                     "stride": stride, "offset": off}
    meta = {"format": FORMAT, "op": case.op, "property": prop, "impl": f"{impl.op}={impl.target}",
            "device": str(case.main.device), "versions": versions(), "scalars": case.scalars,
            "params": case.params, "notes": case.notes, "tensors": meta_t}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    return f"normcert replay {shlex.quote(path)}"


def load(path: str, device: str) -> tuple[dict, Case]:
    """(meta, case) from a replay file; ReplayError says what is wrong with it."""
    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        raise ReplayError(f"{path}: not a replay file (expected a .npz archive written by normcert)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ReplayError(f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ReplayError(f"{path}: not a readable replay file ({e})") from None
    try:
        meta = json.loads(bytes(data["meta"]).decode())
    except (KeyError, ValueError, UnicodeDecodeError):
        raise ReplayError(f"{path}: missing or corrupt metadata") from None
    if meta.get("format") != FORMAT:
        raise ReplayError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("op") not in INFO:
        raise ReplayError(f"{path}: unknown op {meta.get('op')!r}")
    if meta.get("property") not in CHECKS:
        raise ReplayError(f"{path}: unknown property {meta.get('property')!r}, expected one of {', '.join(CHECKS)}")
    if not isinstance(meta.get("impl"), str):
        raise ReplayError(f"{path}: 'impl' must be a string OP=MODULE:ATTR")
    tensors = {}
    try:
        for k, m in meta["tensors"].items():
            if m is None:
                tensors[k] = None
                continue
            dtype = torch.bool if m["dtype"] == _BOOL else BY_NAME[m["dtype"]]
            raw = data[f"t_{k}"]
            flat = torch.from_numpy(raw.copy()).view(dtype) if raw.size else torch.empty(0, dtype=dtype)
            flat = flat.to(device)
            needed = 1 + sum((s - 1) * st for s, st in zip(m["shape"], m["stride"])) if all(m["shape"]) else 0
            if flat.numel() < needed:
                raise ReplayError(f"{path}: tensor {k!r} is truncated")
            t = torch.as_strided(flat, m["shape"], m["stride"], m["offset"]) if needed else flat.reshape(m["shape"])
            tensors[k] = t
        case = Case(meta["op"], tensors, dict(meta["scalars"]), dict(meta["notes"]), dict(meta["params"]))
    except ReplayError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ReplayError(f"{path}: corrupt tensor data ({type(e).__name__}: {e})") from None
    return meta, case
