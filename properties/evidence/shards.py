"""Shards of a run's checks (``--shard K/N``), and the one certificate merged from them.

A run's checks are the strings "kernel id property dtype" of its scope (``families.expected``),
sorted: ``C = [c_0, c_1, ..., c_{M-1}]``.  Shard K of N (1 <= K <= N) holds

    C_K = [c_i : i = K-1 (mod N)]                                     (``assigned``)

(round-robin over the sorted list): every check lies in exactly one shard, shard sizes differ by at
most one, and the split depends on C alone, not on the machine, ``-n`` or pytest's collection order.
A shard's certificate records K, N, its checks C_K, M and the SHA-256 of C (``record``,
``identity``); its verdict is at best "shard passed", never "certified" (``verdict.judge``).

``merge(c_1, ..., c_m)`` is one certificate whose verdict is ``verdict.judge`` over the union of the
shards' rows, with expected checks the union of the C_K, and run state "complete" only when

    {K_1, ..., K_m} = {1, ..., N} with each K once, one N, one identity, the C_K disjoint and their
    union of M checks hashing to the identity, no check with rows in two shards, every shard run
    complete, and the settings of ``SAME``, the scope, the kernels and the code each kernel runs
    (``code.record``: its module and the files it imports from its package or folder, by SHA-256)
    equal in every shard;

otherwise the state says which of these failed ("merged with problems: ..."), and the verdict is
"not certified".  Each kernel's Triton coverage is merged (``coverage.merge``): what each shard
launched, added; "not reached" what no shard reached.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections import Counter

from . import code, coverage
from .verdict import judge, key

SAME = ("normcert", "commit", "torch", "device", "device_name", "profile", "seed", "bitwise")
"""The environment's fields every shard of one merge must share."""

_SHARD = re.compile(r"([0-9]+)/([0-9]+)")


def parse(text: str, flag: str = "--shard") -> tuple[int, int]:
    """(K, N) from "K/N"; ValueError, one line naming ``flag``, unless 1 <= K <= N."""
    m = _SHARD.fullmatch(str(text).strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"{flag} {text}: expected K/N, two whole numbers with 1 <= K <= N (e.g. 2/3)")
    return int(m.group(1)), int(m.group(2))


def assigned(checks: list[str], shard: tuple[int, int] | None) -> list[str]:
    """Shard K/N's checks of the sorted ``checks``: every N-th from the K-th (all of them for None)."""
    if shard is None:
        return list(checks)
    k, n = shard
    return sorted(checks)[k - 1::n]


def identity(checks) -> str:
    """SHA-256 of the sorted checks, one a line: the full set a shard is a part of."""
    return hashlib.sha256("\n".join(sorted(checks)).encode()).hexdigest()


def record(shard: tuple[int, int] | None, checks: list[str]) -> dict | None:
    """The certificate's ``shard`` field of shard ``shard`` of ``checks`` (None: the run is whole)."""
    if shard is None:
        return None
    return {"index": shard[0], "count": shard[1], "checks": assigned(checks, shard), "total": len(checks),
            "identity": identity(checks)}


def problems(named: list[tuple[str, dict]]) -> list[str]:
    """What keeps the certificates ``named`` ((file, certificate) pairs) from being the shards of one
    run (module docstring), each in words naming the file; [] when they are."""
    out = []
    for name, cert in named:
        if not cert.get("shard"):
            out.append(f"{name} is not a shard (a run without --shard)")
        elif cert.get("run") != "complete":
            out.append(f"{name}: its run is not complete ({cert.get('run')})")
    shards = [(name, cert["shard"]) for name, cert in named if cert.get("shard")]
    if not shards:
        return out
    first_name, first = named[0]
    for field, what in (("count", "shard count"), ("identity", "set of checks")):
        for name, s in shards:
            if s[field] != shards[0][1][field]:
                out.append(f"{name}: another {what} than {shards[0][0]} (a shard of another run)")
    for field in SAME:
        for name, cert in named[1:]:
            mine, theirs = first.get("environment", {}).get(field), cert.get("environment", {}).get(field)
            if mine != theirs:
                out.append(f"{name}: {field} {theirs!r}, but {first_name} has {mine!r}")
    for name, cert in named[1:]:
        if cert.get("scope") != first.get("scope"):
            out.append(f"{name}: its scope differ from {first_name}'s")
        if _kernels(cert) != _kernels(first):
            out.append(f"{name}: its implementations differ from {first_name}'s")
    for name, cert in named:
        for kernel, impl in sorted(cert.get("implementations", {}).items()):
            if "code" not in impl or impl["code"] is None:
                out.append(f"{name}: names no code for {kernel} (a certificate before normcert-certificate/10): "
                           f"its code cannot be told the same as the other shards'")
        if name == first_name:
            continue
        for kernel, impl in sorted(cert.get("implementations", {}).items()):
            theirs = first.get("implementations", {}).get(kernel, {}).get("code")
            changed = code.changes(theirs, impl.get("code")) if theirs and impl.get("code") else []
            if changed:
                out.append(f"{name}: the code of {kernel} differs from {first_name}'s ({'; '.join(changed)}): "
                           f"shards of two versions of a kernel certify neither")
    n = shards[0][1]["count"]
    seen = Counter(s["index"] for _, s in shards)
    out += [f"shard {k}/{n} is given {seen[k]} times" for k in sorted(seen) if seen[k] > 1]
    out += [f"shard {k}/{n} is missing" for k in range(1, n + 1) if k not in seen]
    owner: dict[str, str] = {}
    twice = []
    for name, cert in named:
        for check in sorted({key(r) for r in cert.get("results", [])}):
            if check in owner and owner[check] != name:
                twice.append(f"{check} ({owner[check]}, {name})")
            owner.setdefault(check, name)
    if twice:
        out.append(f"{len(twice)} check(s) have results in two shards, e.g. {twice[0]}")
    union = {c for _, s in shards for c in s["checks"]}
    if not seen.keys() - set(range(1, n + 1)) and len(seen) == n and identity(union) != shards[0][1]["identity"]:
        out.append("the shards' checks do not make up the set of checks they name")
    return out


def merge(named: list[tuple[str, dict]], schema: str) -> dict:
    """The certificate of the shards ``named`` ((file, certificate) pairs, in the order given),
    judged again (module docstring); ``schema`` is the certificate format written."""
    wrong = problems(named)
    certs = [c for _, c in sorted(named, key=lambda nc: (nc[1].get("shard") or {}).get("index", 0))]
    first = certs[0]
    rows = sorted((r for c in certs for r in c.get("results", [])),
                  key=lambda r: (r["impl"], r["property"], r["dtype"]))
    expected = sorted({c for cert in certs for c in (cert.get("shard") or {}).get("checks", [])})
    done = {key(r) for r in rows}
    not_run = [c for c in expected if c not in done]
    statuses = [c.get("pytest_exit_status") for c in certs]
    status = next((s for s in statuses if s != 0), 0)
    state = "complete" if not wrong else "merged with problems: " + "; ".join(wrong)
    verdict, disagreement = judge(rows, expected, status if isinstance(status, int) else 1,
                                  [x for c in certs for x in c.get("crashed", [])], state)
    return {"run": state, "schema": schema, "verdict": verdict, "disagreement": disagreement,
            "pytest_exit_status": status, "deselected": [x for c in certs for x in c.get("deselected", [])],
            "crashed": [x for c in certs for x in c.get("crashed", [])], "scope": first.get("scope", {}),
            "not_run": not_run, "config": first.get("config", {}), "environment": first.get("environment", {}),
            "summary": dict(Counter(r["outcome"] for r in rows)), "implementations": _implementations(certs),
            "results": rows, "shard": None,
            "merged_from": [{"file": os.path.basename(name), "shard": _words(c.get("shard"))} for name, c in named]}


def _kernels(cert: dict) -> dict:
    """The certificate's implementations but for their code (compared on its own: ``code.changes``)
    and what each shard's checks reached of their Triton functions (merged: ``_implementations``)."""
    return {k: {f: v for f, v in impl.items() if f not in ("code", "triton")}
            for k, impl in cert.get("implementations", {}).items()}


def _implementations(certs: list[dict]) -> dict:
    """The first shard's implementations, each with its Triton coverage merged over every shard's
    (``coverage.merge``: the launches added, "not reached" where no shard reached it)."""
    out = {}
    for kernel, impl in certs[0].get("implementations", {}).items():
        records = [c.get("implementations", {}).get(kernel, {}).get("triton") for c in certs]
        out[kernel] = {**impl, **({"triton": coverage.merge(records)} if "triton" in impl else {})}
    return out


def _words(shard: dict | None) -> str:
    """"K/N" of a shard record, "" for a whole run."""
    return f"{shard['index']}/{shard['count']}" if shard else ""
