"""Which of a Triton kernel's own ``@triton.jit`` functions a run reached: the certificate's ``triton``.

Each result row holds the launches its check made (``harness.launches``: "module:qualname" ->
{"launches", "meta"}).  For a kernel, ``record(impl_id, rows, modules)`` is

    {"ran": {name: {"launches": n, "meta": {key: [values]},     the launches of the kernel's own rows,
                    "programs": [fewest, most]}}                 summed, their values' union, the
                                                                 programs' range (where known);
     "not_reached": [names]}                                     the jit functions defined in the
                                                                 kernel's modules (``defined``), and
                                                                 in the modules of those it launched
                                                                 (a library's, behind an adapter),
                                                                 that the run did not reach,

or None where the modules define no jit function and the kernel launched none (not a Triton kernel).
A function is *reached* when some row of the run (any kernel's) launched it, or when the source of a
reached function calls it by name (a ``@triton.jit`` helper: on a GPU it is compiled into its caller,
never launched; so is one called only under a branch the launches did not take).  So a path behind a
dispatch the cases never reach (a blocked kernel taken from 32,768 rows, beyond the interpreter's
1,025) is named, where a certificate would otherwise say only that its cases were scaled.

Shards and xdist workers: rows carry their own launches, so a certificate's ``ran`` is its rows';
merging shards adds the ``ran`` and intersects the ``not_reached`` (``merge``: a function is
unreached in the whole run exactly when each shard left it unreached, the reached set being
closed under "called by").  The record is a stated fact: the verdict reads result rows only.
"""
from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap

from ..harness.launches import name, ordered, spanned


def record(impl_id: str, rows: list[dict], modules) -> dict | None:
    """The coverage of kernel ``impl_id`` (module docstring): ``rows`` are the run's result rows (every
    kernel's, as the certificate holds them), ``modules`` the names of the kernel's modules (its code
    record's ``files``; those not imported in this process are skipped), to which the modules of the
    functions it launched are added (an adapter's library defines the paths its dispatch chooses)."""
    ran = _sum(r.get("launches", {}) for r in rows if r["impl"] == impl_id)
    functions = defined([*modules, *dict.fromkeys(fn.partition(":")[0] for fn in ran)])
    if not functions and not ran:
        return None
    launched = {n for r in rows for n in r.get("launches", {})}
    reached, waiting = set(launched), list(launched)
    while waiting:
        for callee in functions.get(waiting.pop(), ()):
            if callee not in reached:
                reached.add(callee)
                waiting.append(callee)
    return {"ran": ran, "not_reached": sorted(set(functions) - reached)}


def merge(records: list) -> dict | None:
    """One kernel's coverage from its records in several shards' certificates (module docstring)."""
    found = [r for r in records if r]
    if not found:
        return None
    left = set(found[0]["not_reached"]).intersection(*(r["not_reached"] for r in found[1:]))
    return {"ran": _sum(r["ran"] for r in found), "not_reached": sorted(left)}


def describe(coverage: dict | None) -> str:
    """A coverage record in words, the functions by their short names: "Triton functions run: _fwd
    (BLOCK 64, 128; 12 launches of 1 to 300 programs); not reached: _fwd_blocked" ("" for None)."""
    if not coverage:
        return ""

    def one(fn: str, t: dict) -> str:
        values = "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in t["meta"].items())
        lo, hi = t.get("programs", (None, None))
        grid = "" if lo is None else f" of {lo} program{'s' * (hi != 1)}" if lo == hi else f" of {lo} to {hi} programs"
        return f"{_short(fn)} ({values + '; ' if values else ''}{t['launches']} launches{grid})"

    ran = ", ".join(one(fn, t) for fn, t in coverage["ran"].items()) or "none"
    unreached = ", ".join(_short(fn) for fn in coverage["not_reached"]) or "none"
    return f"Triton functions run: {ran}; not reached: {unreached}"


def defined(modules) -> dict[str, set[str]]:
    """The ``@triton.jit`` functions defined in the imported ``modules`` (an autotuner's or heuristics'
    function included): "module:qualname" -> those of them its source calls by name (not triton's own,
    ``tl.sum`` say)."""
    if "triton" not in sys.modules:
        return {}
    found = {}
    for module in (sys.modules.get(m) for m in modules):
        if module is None:  # a file of the code record the run never imported as that name
            continue
        for value in list(vars(module).values()):
            fn = _jitted(value)
            if fn is not None and fn.__module__ == module.__name__:
                found[name(fn)] = fn
    return {n: _calls(fn) & found.keys() for n, fn in found.items()}


def _jitted(value):
    """The Python function of a jit function (unwrapping autotuners and heuristics), else None."""
    from triton.runtime.jit import KernelInterface  # noqa: PLC0415

    if not isinstance(value, KernelInterface):
        return None
    while isinstance(value, KernelInterface):
        value = getattr(value, "fn", None)
    return value if inspect.isfunction(value) else None


@functools.lru_cache(maxsize=None)  # a module's functions are read once a certificate, not once a kernel
def _calls(fn) -> frozenset[str]:
    """The jit functions ``fn``'s source names (``helper(...)``, ``module.helper(...)``), resolved in its globals."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            target = fn.__globals__.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = getattr(fn.__globals__.get(node.value.id), node.attr, None)
        else:
            continue
        called = _jitted(target) if target is not None else None
        if called is not None and called is not fn:
            out.add(name(called))
    return frozenset(out)


def _sum(tallies) -> dict:
    """Launch tallies added: counts summed, each key's values united (sorted as ``launches.take``),
    the programs' ranges joined."""
    out: dict[str, dict] = {}
    for tally in tallies:
        for fn, t in tally.items():
            entry = out.setdefault(fn, {"launches": 0, "meta": {}})
            entry["launches"] += t["launches"]
            for k, v in t["meta"].items():
                entry["meta"][k] = _union(entry["meta"].get(k, []), v)
            if "programs" in t:
                entry["programs"] = spanned(entry.get("programs"), t["programs"])
    return {fn: {"launches": t["launches"], "meta": dict(sorted(t["meta"].items())),
                 **({"programs": t["programs"]} if "programs" in t else {})} for fn, t in sorted(out.items())}


def _union(a: list, b: list) -> list:
    return ordered({*a, *b})


def _short(fn: str) -> str:
    return fn.rpartition(":")[2]
