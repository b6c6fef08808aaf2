"""The controller's events for the command's console (``news``), from pytest's hooks.

Registered by the ``Suite`` on the controller of a ``normcert certify`` / ``replay`` run only (one with
a news file): xdist's workers send their reports to the controller, whose hooks see them as they come
(``pytest_runtest_logstart``, ``pytest_runtest_logreport``), so one process tells every event, with
``-n`` or without.  What pytest would have printed still goes to its own output, which the command
keeps out of sight unless asked (``certify --pytest-output``); the plugin's plain-words lines reach
both (``note``).
"""
from __future__ import annotations

from . import news


def note(reporter, line: str, **markup) -> None:
    """One of the plugin's plain-words lines (a non-gating finding, checks that did not run): on
    pytest's terminal, and to the command's console."""
    reporter.write_line(line, **markup)
    news.tell("note", line=line)


def label(nodeid: str) -> str:
    """A test's id in the console's words: ``.../test_accuracy.py::test_accuracy[k-float32]`` is
    "accuracy k float32" (the family, then the test's parameters)."""
    name = nodeid.rpartition("::")[2]
    function, _, params = name.partition("[")
    family = function.removeprefix("test_").replace("_", "-")
    shown = [p for p in params.rstrip("]").rsplit("-", 1) if p and p != "NOTSET"]  # NOTSET: no kernel applies
    return " ".join([family, *shown])


class Announcer:
    """Tells the run's events (``news``) as the controller's hooks see them."""

    def __init__(self, suite):
        self.suite = suite

    def pytest_sessionstart(self, session):
        from ... import __version__  # noqa: PLC0415

        s, config = self.suite.session, self.suite.config
        header = {"version": __version__, "device": s.device, "seed": s.seed, "profile": s.profile}
        if s.replay:
            meta, case = s.replay
            news.tell("start", **header, replay=config.getoption("--normcert-replay"), kernels=[s.replay_impl.id],
                      ops=[meta["op"]], property=meta["property"], case=case.describe(), cells=1)
            return
        scope = {k: v or "all" for k, v in self.suite.scope.items()}
        news.tell("start", **header, kernels=[i.id for i in s.impls], ops=sorted({i.op for i in s.impls}),
                  scope=scope, shard=config.getoption("--normcert-shard"), cells=len(self.suite.expected()))

    def pytest_runtest_logstart(self, nodeid, location):
        news.tell("begin", test=label(nodeid))

    def pytest_runtest_logfinish(self, nodeid, location):
        news.tell("end", test=label(nodeid))

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.skipped):
            for key, row in report.user_properties:
                if key == "normcert":
                    news.tell("cell", impl=row["impl"], prop=row["prop"], dtype=row["dtype"],
                              outcome=row["outcome"], units=row.get("worst_units") or 0,
                              message=(row.get("message") or "").split("\n")[0], seconds=row.get("seconds"))
                elif key == "normcert-replay":
                    meta, _ = self.suite.session.replay
                    said = report.longreprtext.split("\n")[0].partition(": ")[2] if report.failed else ""
                    news.tell("cell", impl=self.suite.session.replay_impl.id, prop=meta["property"], dtype="",
                              outcome=row, units=0, message=said)
        if report.failed:
            news.tell("failure", test=label(report.nodeid), when=report.when, text=report.longreprtext)

    def pytest_collectreport(self, report):
        if report.failed:
            news.tell("failure", test=report.nodeid or "collection", when="collect", text=report.longreprtext)
