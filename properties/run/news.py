"""Lines a run says as they happen, for ``normcert certify`` to print at once.

pytest prints a failure when its test ends, after the shrinking and the search for other kinds of
failure (seconds to tens of seconds more); a kernel author fixing a bug wants the first
counterexample as soon as it is found.  Under ``normcert certify`` (``NORMCERT_NEWS`` names a file
of its run folder) ``say`` appends one line there, from whichever process checks the case (an xdist
worker too), and the controller prints each new line while it waits (``cli._wait``).  Elsewhere (a
plain pytest run) it does nothing.  News is never evidence: the verdict and certificate come from
the run's results alone.
"""
from __future__ import annotations

import os

from ..harness.run_settings import NEWS


def say(line: str) -> None:
    """Append ``line`` to the run's news file, if it has one (a write that fails is dropped)."""
    path = os.environ.get(NEWS)
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write(" ".join(line.split("\n")) + "\n")
    except OSError:
        pass
