"""Replay files rewritten by the tests: a saved failure's metadata or members changed after the run
(``rewrite``), and a rewritten file renamed to the name its new bytes give (``restamped``), since a
replay file is named by its content (``evidence.replay_names``) and one whose bytes no longer match
its name is refused as replaced."""
from __future__ import annotations

import json
import os

import numpy as np

from ..evidence import replay_names


def rewrite(path, meta_change=None, **members) -> None:
    """Rewrite the replay file at ``path`` in place: its metadata passed through ``meta_change`` (a
    function changing the dict), its members ``members`` (name -> array) replaced or added."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    if meta_change:
        meta_change(meta)
    arrays.update(members)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez_compressed(path, **arrays)


def named_as(path, cell: str) -> str:
    """``path`` renamed, in its folder, to the name ``save_failure`` gives its bytes in the cell ``cell``
    (``replay_names.cell``, with a "-2" suffix for a cell's second failure); returns the new path."""
    with open(path, "rb") as f:
        new = os.path.join(os.path.dirname(path), replay_names.name(cell, f.read()))
    os.replace(path, new)
    return new


def restamped(path) -> str:
    """``path`` renamed to the name ``save_failure`` gives its bytes now, in the cell its name holds (a
    file rewritten by a test is another file, written under its own name); returns the new path."""
    m = replay_names.STAMPED.match(os.path.basename(path))
    return named_as(path, m["cell"] + (m["nth"] or ""))
