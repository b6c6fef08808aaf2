"""The ``normcert`` command (also ``python -m normcert``).

    normcert certify OP=MODULE:ATTR [...] [--device cpu|cuda] [--profile dev|ci|thorough|large]
                     [--certificate PATH] [--seed N] [--bitwise] [--require-backward]
                     [--kernel-timeout S] [-n N]
                     [-- PYTEST-ARGS...]
    normcert replay FILE [--impl OP=MODULE:ATTR] [--device cpu|cuda]
    normcert list

``certify`` and ``replay`` run normcert's properties through pytest (the same
plugin as ``pytest --pyargs normcert.properties``) and end with a verdict table.
Exit status: 0 certified (or, for replay, the property now holds), 1 a property
fails, 4 a usage error; 2 and 3 are pytest's (interrupted, internal error).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import pytest

from normcert.properties.plugin import PROFILES

USAGE = 4


class _Results:
    """A pytest plugin that hands the run's results to the command."""

    def __init__(self):
        self.results: list[dict] = []

    def pytest_sessionfinish(self, session):
        suite = session.config.pluginmanager.get_plugin("normcert-suite")
        if suite is not None:
            self.results = list(suite.results)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="normcert", description="Certify numerical kernels against exact oracles.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{certify,replay,list}")
    c = sub.add_parser("certify", help="certify kernels: OP=MODULE:ATTR ...")
    c.add_argument("impls", nargs="+", metavar="OP=MODULE:ATTR")
    c.add_argument("--device", choices=("cpu", "cuda"))
    c.add_argument("--profile", choices=tuple(PROFILES), default="ci")
    c.add_argument("--certificate", metavar="PATH")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--bitwise", action="store_true")
    c.add_argument("--require-backward", action="store_true", help="a forward-only kernel fails (training kernels)")
    c.add_argument("--failures-dir", metavar="DIR")
    c.add_argument("--kernel-timeout", metavar="SECONDS", help="a call with no result after this long is hung")
    c.add_argument("-n", dest="workers", metavar="N", help="pytest-xdist workers (a number or auto)")
    r = sub.add_parser("replay", help="re-run one saved failing case")
    r.add_argument("file")
    r.add_argument("--impl", metavar="OP=MODULE:ATTR")
    r.add_argument("--device", choices=("cpu", "cuda"))
    sub.add_parser("list", help="the registry of implementations")
    return p


def _pytest_args(a) -> list[str]:
    args = ["--pyargs", "normcert.properties", "-p", "no:cacheprovider"]
    if a.command == "certify":
        for spec in a.impls:
            args += ["--impl", spec]
        args += ["--hypothesis-profile", a.profile, "--seed", str(a.seed)]
        if a.certificate:
            args += ["--certificate", a.certificate]
        if a.bitwise:
            args.append("--bitwise")
        if a.require_backward:
            args.append("--require-backward")
        if a.failures_dir:
            args += ["--failures-dir", a.failures_dir]
        if a.kernel_timeout:
            args += ["--kernel-timeout", a.kernel_timeout]
        if a.workers:
            args += ["-n", a.workers]
        args += a.pytest_args
    else:
        args += ["--replay", a.file]
        if a.impl:
            args += ["--impl", a.impl]
    if a.device:
        args += ["--device", a.device]
    return args


def verdict_table(results: list[dict]) -> list[str]:
    """Per implementation, property and dtype: pass / fail / not certified, and the worst ulp."""
    cells: dict[tuple, dict] = defaultdict(dict)
    for r in results:
        cells[(r["impl"], r["prop"])][r["dtype"]] = r
    dtypes = [d for d in ("float64", "float32", "float16", "bfloat16") if any(r["dtype"] == d for r in results)]
    word = {"pass": "pass", "fail": "FAIL", "warn": "warn", "expected-fail": "xfail",
            "not-supported": "not certified", "not-certified": "not certified (forward only)"}
    rows = [("implementation", "property", *dtypes)]
    for (impl, prop), by in sorted(cells.items()):
        row = [impl, prop]
        for d in dtypes:
            r = by.get(d)
            if r is None:
                row.append("-")
            else:
                ulp = f" {r['worst_ulps']:.3g} ulp" if r["outcome"] in ("pass", "warn") and r["worst_ulps"] else ""
                row.append(word.get(r["outcome"], r["outcome"]) + ulp)
        rows.append(tuple(row))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _list() -> int:
    from normcert.impls.__main__ import main as show  # noqa: PLC0415

    show()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: passed to pytest as they are
    a = _parser().parse_args(argv[:cut])  # argparse exits 2 on bad usage; ``entry`` maps that to 4
    a.pytest_args = argv[cut + 1:]
    if a.command == "list":
        return _list()
    collector = _Results()
    status = int(pytest.main(_pytest_args(a), plugins=[collector]))
    if collector.results:
        print("\nnormcert verdict")
        print("\n".join(verdict_table(collector.results)))
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("normcert: nothing was checked (no test applies to these kernels on this device)", file=sys.stderr)
        return 1
    return status


def entry() -> None:
    try:
        code = main()
    except SystemExit as e:  # argparse: usage errors exit 2; normcert's usage status is 4
        code = USAGE if e.code == 2 else e.code
    raise SystemExit(code)
