"""The verdict from the evidence alone: the result rows, and the checks the run was to make.

    certified  <=>  rows != [] (a shard: or its part is empty)  and  no row is "fail", "error" or "not-run"
                    and  every expected (kernel, property, dtype) has a row
                    and  no xdist worker crashed  and  the run completed
                    and  pytest's exit status is 0

pytest's exit status enters only as one more way to be *not* certified: a plugin, an ini file's
``addopts = -p ...`` or a ``conftest.py`` can turn a failed report into a passed one, or set the
session's exit status to 0, but it does not change the rows, which carry each check's own outcome.
Where pytest says 0 and the rows say otherwise the two disagree, and the certificate says so.

A shard's run (``--shard K/N``, ``shards``) checks a part of the scope: where the rule holds for its
part, its verdict is "shard passed", never "certified"; ``normcert merge`` judges the shards' rows
together by this same rule.

Both the run's own plugin (``plugin.Suite``) and the ``normcert`` command's parent process
(``normcert.cli``, which reads the run record and never runs kernel code) judge with ``judge``;
this module imports nothing heavy, so the parent stays free of torch.
"""
from __future__ import annotations

DTYPE_ORDER = ("float64", "float32", "float16", "bfloat16")
"""The order every table and headline lists dtypes in."""

PASSED = ("certified", "shard passed")
"""The verdicts of a run that checked its part and failed none of it (a shard's is the second)."""

FAILING = ("fail", "error", "not-run")
"""Outcomes that fail a run (a case study's failure is "expected-fail", a non-gating one "warn"):
"not-run" is a check whose cases held 0 elements, which certifies nothing."""


def key(row: dict) -> str:
    """A row's check, as ``not_run`` names it: "kernel id property dtype"."""
    return f"{row['impl']} {row.get('prop', row.get('property'))} {row['dtype']}"


def failing(rows: list[dict]) -> list[str]:
    """The checks whose rows fail the run."""
    return [key(r) for r in rows if r["outcome"] in FAILING]


def judge(rows: list[dict], expected: list[str], pytest_status: int, crashed: list[str], state: str,
          certifying: bool = True, shard=None) -> tuple[str, str]:
    """(verdict, disagreement): "certified" ("shard passed" where ``shard`` is given: a shard's run)
    or "not certified" by the rule in the module docstring,
    and "" or one sentence saying how pytest's exit status and the rows disagree.  ``certifying``
    False (the suite's own test run, no kernel plugged in and no certificate) drops the rule that
    every expected check left a row: such a run is judged by its rows and pytest alone."""
    bad = failing(rows)
    missing = sorted(set(expected) - {key(r) for r in rows}) if certifying else []
    disagreement = ""
    if pytest_status == 0 and bad:
        disagreement = (f"pytest reported success (exit status 0) but {len(bad)} result row(s) fail, e.g. {bad[0]}: "
                        f"something in the run (a plugin, an ini file, a conftest.py) changed its reports")
    vacuous = shard is not None and not expected  # a shard of fewer checks than shards: nothing of it to fail
    certified = ((bool(rows) or vacuous) and not bad and not missing and not crashed and state == "complete"
                 and pytest_status == 0)
    return (("shard passed" if shard else "certified") if certified else "not certified"), disagreement


def rejudge(cert: dict) -> str:
    """The verdict of a certificate's own rows, by ``judge``: its result rows, its checks that did
    not run (``not_run``: the expected checks without a row), a shard's own checks (``shard``), its crashed workers, its run state and
    pytest's exit status (absent from an incomplete certificate: not 0).  What a page built from a
    certificate shows, whatever the certificate's stored "verdict" says.  A run that never reached
    its end (``run`` "incomplete: ...") is "incomplete", the certificate's own word for it."""
    if str(cert.get("run", "")).startswith("incomplete"):
        return "incomplete"
    rows = cert.get("results") or []
    shard = cert.get("shard") or {}
    expected = [key(r) for r in rows] + list(cert.get("not_run") or []) + list(shard.get("checks", []))
    status = cert.get("pytest_exit_status")
    return judge(rows, expected, status if isinstance(status, int) else 1, cert.get("crashed") or [],
                 str(cert.get("run", "")), shard=cert.get("shard"))[0]
