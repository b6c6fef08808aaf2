"""What a run's process sets up once before its first case, off the critical path where it can be.

``torch_threads``
    one torch thread per xdist worker, so that two workers do not fight over two cores.
``build_oracle``
    the float64 oracle's native kernels (``oracle.native``: a C compile of about 0.4 s, then a
    load and a self-test), built in a background thread started before the kernels' modules are
    imported, so that the compiler runs beside the rest of the start (the kernels' imports,
    collection, the sample probes) instead of inside the first case; the first oracle call waits
    for it (``native.kernels`` holds a lock while it chooses).  The integrity check is unchanged:
    the library is built into a fresh private folder, hashed after the compiler and after the
    load, self-tested, and its folder removed, now before any kernel code has run rather than
    after.  An xdist controller, which checks no case, builds none.
"""
from __future__ import annotations

import os
import threading


def torch_threads() -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch  # noqa: PLC0415 - called after the run's torch import; keeps this module light

        torch.set_num_threads(1)


def build_oracle(config) -> threading.Thread | None:
    """Start building the native oracle kernels in a daemon thread (None where this process checks no case)."""
    if config.getoption("numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    from ...oracle import native  # noqa: PLC0415 - imports torch, which the run has imported by now

    thread = threading.Thread(target=native.kernels, name="normcert-oracle-build", daemon=True)
    thread.start()
    return thread
