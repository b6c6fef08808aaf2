"""Which ``@triton.jit`` functions a kernel launched, and with which constexpr and launch values.

``record()`` wraps Triton's launch entry once per process: ``JITFunction.run`` (a GPU launch,
compiled) and ``InterpretedFunction.run`` (``TRITON_INTERPRET=1``), the method ``fn[grid](...)``
calls, and the one an autotuner or heuristics wrapper calls with its config's values.  Each launch
(not a warm-up) adds to this process's tally, under the launched function's name
"module:qualname":

* ``launches``: how many times it was launched;
* ``meta``: for each of its ``tl.constexpr`` parameters, and each launch option given to the
  launch (``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``: "where known", i.e. passed by
  the caller or its autotuner config; a default the launcher fills in is not seen; under the
  interpreter an option is given but not run), the distinct values it was launched with (a
  ``tl.dtype`` or other non-JSON value by its ``str``);
* ``programs``: [fewest, most] programs one of its launches ran, the product of the grid's
  dimensions (a callable grid read from what it returns to Triton: it is not called again); absent
  where no grid was seen (a grid Triton could not use raises before it is read).

``take()`` hands the tally over and starts a new one: the runner takes it when it records a result
(``runner.record``), so a result row holds the launches its check made, in whichever process ran it.
Launches made inside ``paused()`` (normcert's own probe kernels: ``interpreter.install``) are not
counted.  A thread still running a hung kernel call may launch into the next result's tally.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import sys
import threading

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

_lock = threading.Lock()
_tally: dict[str, dict] = {}
_paused = threading.local()
_constexprs: dict[object, tuple] = {}  # python function -> (its signature, its constexpr parameters)


def record() -> None:
    """Count every launch from now on (module docstring); once per process, a no-op until a kernel
    (or the registry) has imported triton."""
    if "triton" not in sys.modules:
        return
    try:
        from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415
        from triton.runtime.jit import JITFunction  # noqa: PLC0415
    except ImportError:
        return
    for cls in (JITFunction, InterpretedFunction):
        if not getattr(cls.run, "normcert_counted", False):
            cls.run = _counted(cls.run)


def take() -> dict[str, dict]:
    """The launches since the last ``take`` in this process: name -> {"launches": n, "meta": {key:
    [distinct values, sorted]}}, and a new, empty tally."""
    global _tally
    with _lock:
        tally, _tally = _tally, {}
    return {name: {"launches": t["launches"], "meta": {k: ordered(v) for k, v in sorted(t["meta"].items())},
                   **({"programs": t["programs"]} if "programs" in t else {})}
            for name, t in sorted(tally.items())}


@contextlib.contextmanager
def paused():
    """Launches made in this thread inside the block are not counted."""
    before = getattr(_paused, "on", False)
    _paused.on = True
    try:
        yield
    finally:
        _paused.on = before


def name(fn) -> str:
    """"module:qualname" of a Python function."""
    return f"{fn.__module__}:{fn.__qualname__}"


def _counted(run):
    def counted(self, *args, grid, warmup, **kwargs):
        if not warmup and not getattr(_paused, "on", False):
            grid = _seen(_add(self.fn, args, kwargs), grid)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    counted.normcert_counted = True
    return counted


def _seen(key: str, grid):
    """``grid`` as Triton will use it, its programs added to ``key``'s tally when Triton reads it:
    a callable grid is wrapped (Triton calls it once, with the launch's arguments), a tuple noted now."""
    if not callable(grid):
        _programs(key, grid)
        return grid

    def read(meta):
        got = grid(meta)
        _programs(key, got)
        return got

    return read


def _programs(key: str, grid) -> None:
    try:
        dims = [int(d) for d in (grid if isinstance(grid, (tuple, list)) else (grid,))]
    except (TypeError, ValueError):  # not a grid: the launch will say so
        return
    n = math.prod(dims)
    with _lock:
        entry = _tally.get(key)
        if entry is not None:  # None: taken by a result since the launch began (a thread's late launch)
            entry["programs"] = spanned(entry.get("programs"), [n, n])


def spanned(a: list | None, b: list) -> list:
    """The range [fewest, most] of programs that covers both ranges (``a`` None: none yet)."""
    return list(b) if a is None else [min(a[0], b[0]), max(a[1], b[1])]


def _add(fn, args, kwargs) -> str:
    if fn not in _constexprs:
        from triton.runtime.jit import _normalize_ty  # noqa: PLC0415

        signature = inspect.signature(fn)
        _constexprs[fn] = (signature, tuple(p.name for p in signature.parameters.values()
                                            if p.annotation is not p.empty and _normalize_ty(p.annotation) == "constexpr"))
    signature, constexprs = _constexprs[fn]
    try:
        bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
    except TypeError:  # the launch itself will say what is wrong
        bound = signature.bind_partial()
    values = {k: bound.arguments[k] for k in constexprs if k in bound.arguments}
    values.update({k: kwargs[k] for k in LAUNCH_OPTIONS if kwargs.get(k) is not None})
    key = name(fn)
    with _lock:
        entry = _tally.setdefault(key, {"launches": 0, "meta": {}})
        entry["launches"] += 1
        for k, v in values.items():
            entry["meta"].setdefault(k, set()).add(_plain(v))
    return key


def _plain(value):
    """A constexpr's value as JSON holds it: a bool, number, string or None as it is, else its ``str``."""
    value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def ordered(values) -> list:
    """Distinct values in a fixed order: by type name, then value."""
    return sorted(values, key=lambda v: (type(v).__name__, v if not isinstance(v, type(None)) else 0))
