"""What a run says as it happens, for ``normcert certify`` and ``replay`` to print at once.

Under ``normcert certify`` (``NORMCERT_NEWS`` names a file of its run folder) the run appends one
event a line, as JSON, and the command's console (``presentation.console``) reads them while it waits
(``cli._wait``): the run's header (``start``), each test as it starts (``begin``), each (kernel,
property, dtype) result row as it reaches the controller (``cell``), each failed report pytest holds,
printed once (``failure``), the plugin's plain-words notes (``note``), and the first counterexample of
a property (``found``) the moment it is found: pytest reports a failure when its test ends, after the
shrinking and the search for other kinds of failure (seconds to tens of seconds more), and a kernel
author fixing a bug wants it at once.  ``found`` is written by whichever process checks the case (an
xdist worker too); every other event by the controller, which receives the workers' reports.

Elsewhere (a plain pytest run) nothing is written.  News is never evidence: the verdict and the
certificate come from the run's results alone.
"""
from __future__ import annotations

import json
import os

from ..harness.run_settings import NEWS


def listening() -> bool:
    """Does this run have a news file (a ``normcert certify`` / ``replay`` run)?"""
    return bool(os.environ.get(NEWS))


def tell(kind: str, **fields) -> None:
    """Append the event ``kind`` with ``fields`` to the run's news file, if it has one, as one line
    (a write that fails is dropped: news is never evidence)."""
    path = os.environ.get(NEWS)
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}, default=str) + "\n")
    except OSError:
        pass


def say(line: str) -> None:
    """The first counterexample of a property, said as one line (``found``)."""
    tell("found", line=" ".join(line.split("\n")))


def read(path: str, offset: int) -> tuple[list[dict], int]:
    """The events written to ``path`` since ``offset``, whole lines only (a line still being written
    waits for the next read), and the new offset; a line that is not an event is skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read()
    except OSError:
        return [], offset
    done = text.rfind(b"\n") + 1
    events = []
    for line in text[:done].decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "kind" in event:
            events.append(event)
    return events, offset + done
