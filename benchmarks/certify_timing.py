"""A pytest plugin for ``benchmarks/certify.py``: when each test of a ``normcert certify`` run starts
and ends, and when the kernel's sample probes (``probes.on_sample``) and the native oracle's build
(``oracle.native.build``) run, as wall-clock times (``time.time``, comparable across processes).

Loaded into the run's pytest process (``normcert certify ... -- -p certify_timing``, with this folder
on ``PYTHONPATH``), it writes ``$NORMCERT_BENCH_TIMES.<pid>.json`` at the end of the session of each
process (the controller and each xdist worker):

    {"configure": t, "tests": [[nodeid, start, end], ...], "probes": [[start, end], ...],
     "native": [[start, end], ...], "end": t}

It changes no result: the wrapped functions are called with the same arguments and their values
and exceptions passed on unchanged.
"""
from __future__ import annotations

import functools
import json
import os
import time

_record: dict = {"configure": None, "tests": [], "probes": [], "native": [], "end": None}
_started: dict = {}
_depth = [0]


def _timed(fn, spans):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = _depth[0] == 0
        _depth[0] += 1
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            _depth[0] -= 1
            if outer:
                spans.append([start, time.time()])
    return wrapper


def pytest_configure(config):
    _record["configure"] = time.time()


def pytest_sessionstart(session):
    # normcert's own configure hook has imported torch and its modules by now
    from normcert.oracle import native  # noqa: PLC0415 - the run's own modules, imported after its start
    from normcert.properties.harness import probes  # noqa: PLC0415

    probes.on_sample = _timed(probes.on_sample, _record["probes"])
    native.build = _timed(native.build, _record["native"])


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    _record["tests"].append([nodeid, _started.pop(nodeid, None), time.time()])


def pytest_unconfigure(config):
    _record["end"] = time.time()
    out = os.environ.get("NORMCERT_BENCH_TIMES")
    if out:
        with open(f"{out}.{os.getpid()}.json", "w") as f:
            json.dump(_record, f)
