"""The ``normcert`` command (also ``python -m normcert``).

    normcert certify OP=MODULE:ATTR [...] [--agree OP=MODULE:ATTR OP=MODULE:ATTR] [--device cpu|cuda] [--profile dev|ci|thorough|large]
                     [--domain SPEC] [--compile] [--certificate PATH] [--seed N] [--bitwise] [--require-backward]
                     [--kernel-timeout S] [-n N] [--shard K/N] [-v/--pytest-output]
                     [-- PYTEST-ARGS...]
    normcert replay FILE [--impl OP=MODULE:ATTR ...] [--device cpu|cuda] [--kernel-timeout S] [--export REPRO.py]
                    [-v/--pytest-output]
    normcert list
    normcert schema
    normcert report CERT.json [-o REPORT.html]
    normcert compare A.json B.json [--format text|markdown|html] [-o PATH] [--fail-on regression|any-change|never]
    normcert merge A.json B.json ... -o C.json

``certify --shard K/N`` runs the K-th of N shards of the run's checks and ``merge`` joins the shards'
certificates into one, judged again (``properties.evidence.shards``, ``properties.presentation.merge_cli``);

``report`` draws a certificate as one HTML page that works offline (``properties.presentation.report``; ``certify
--report PATH`` writes it after the run, from the certificate as judged here); ``compare`` lists the
cells whose outcome or error / bound changed between two certificates (``properties.presentation.compare``).
``certify`` and ``replay`` run normcert's properties through pytest (the same
plugin as ``pytest --pyargs normcert.properties``) and end with a verdict table.
Exit status: 0 certified (or, for replay, the property now holds), 1 a property
fails or the run did not check everything it lists, 4 a usage error; 2 and 3
are pytest's (interrupted, internal error).

normcert owns the run: pytest runs in a child process under normcert's own
configuration (``_child_config``: no ini file, ``conftest.py`` or ``PYTEST_*`` variable
(``PYTEST_ADDOPTS``, ``PYTEST_PLUGINS``, an xdist worker's) of the folder or process it is started from), and this process judges
it.  The child's plugin writes its verdict to a run record as its very last step
(``run_settings.RUN_RECORD``); a child that ended without one (a kernel called
``os._exit(0)``, or died) never exits 0 here, and one that does not exit after its
run ended (a kernel's non-daemon thread or finalizer) is ended after the kernel
timeout, as any call into kernel code would be: its certificate's run state then reads
"complete, but then ... ended by normcert" (``_state``), which the verdict is judged from, so
``compare`` and ``merge`` judging it again find it not certified too.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

from normcert.properties.evidence import verdict
from normcert.properties.harness.run_settings import HEARTBEAT, KERNEL_TIMEOUT, NEWS, PROFILES, RUN_RECORD, STALLED
from normcert.properties.presentation.console import Console
from normcert.properties.run.news import read

USAGE = 4
NO_TESTS = 5  # pytest's exit status when it collected nothing


PYTEST_OUTPUT = ("print pytest's own report of the run (its session, a line per test module, its failures "
                 "and counts) in place of normcert's console; the verdict and table stay")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="normcert", description="Certify numerical kernels against exact oracles.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{certify,replay,list,schema,report,compare,merge}")
    c = sub.add_parser("certify", help="certify kernels: OP=MODULE:ATTR ...")
    c.add_argument("impls", nargs="*", metavar="OP=MODULE:ATTR")
    c.add_argument("--agree", nargs=2, action="append", default=[], metavar=("OP=MODULE:ATTR", "OP=MODULE:ATTR"),
                   help="certify both and require the same bits from them on every case (repeatable)")
    c.add_argument("--device", choices=("cpu", "cuda"))
    c.add_argument("--profile", choices=tuple(PROFILES), default="ci")
    c.add_argument("--certificate", metavar="PATH")
    c.add_argument("--report", metavar="PATH", help="after the run, write the certificate's HTML report here")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--bitwise", action="store_true")
    c.add_argument("--require-backward", action="store_true", help="a forward-only kernel fails (training kernels)")
    c.add_argument("--failures-dir", metavar="DIR")
    c.add_argument("--kernel-timeout", metavar="SECONDS", help="a call with no result nor progress for this long is hung")
    c.add_argument("-n", dest="workers", metavar="N", help="pytest-xdist workers (a number or auto)")
    c.add_argument("--domain", metavar="SPEC",
                   help="the kernels' declared domain, e.g. 'dtypes=float16,bfloat16 width_multiple=8' (docs/reference/op-contracts.md)")
    c.add_argument("--compile", action="store_true",
                   help="check the kernels as a compiled model calls them (torch.library.opcheck of the operators "
                        "they call, torch.compile(fullgraph=True)); a torch operator always is")
    c.add_argument("--property", action="append", default=[], metavar="NAME",
                   help="declare the scope: only these property families (repeatable); the certificate says so")
    c.add_argument("--dtype", action="append", default=[], metavar="DTYPE",
                   help="declare the scope: only these dtypes (repeatable); the certificate says so")
    c.add_argument("--shard", metavar="K/N", help="run the K-th of N shards of the checks (normcert merge joins them)")
    c.add_argument("-v", "--pytest-output", action="store_true", help=PYTEST_OUTPUT)
    r = sub.add_parser("replay", help="re-run one saved failing case")
    r.add_argument("file")
    r.add_argument("--impl", action="append", default=[], metavar="OP=MODULE:ATTR",
                   help="the kernel to replay (and, for an agreement failure, the kernel it must agree with)")
    r.add_argument("--device", choices=("cpu", "cuda"))
    r.add_argument("--kernel-timeout", metavar="SECONDS", help="a call with no result nor progress for this long is hung")
    r.add_argument("--export", metavar="REPRO.py", help="write a standalone reproducer (torch, numpy and the kernel "
                                                       "only) instead of replaying")
    r.add_argument("-v", "--pytest-output", action="store_true", help=PYTEST_OUTPUT)
    sub.add_parser("list", help="the registry of implementations")
    sub.add_parser("schema", help="print the certificate's JSON Schema")
    rep = sub.add_parser("report", help="a certificate as one offline HTML page")
    rep.add_argument("certificate", metavar="CERT.json")
    rep.add_argument("-o", dest="output", metavar="PATH", help="the HTML file (default: beside CERT.json, as .html)")
    cmp = sub.add_parser("compare", help="the cells that changed between two certificates")
    cmp.add_argument("before", metavar="A.json")
    cmp.add_argument("after", metavar="B.json")
    cmp.add_argument("--format", choices=("text", "markdown", "html"), default="text")
    cmp.add_argument("-o", dest="output", metavar="PATH", help="write here instead of standard output")
    cmp.add_argument("--fail-on", choices=("regression", "any-change", "never"), default="regression",
                     help="what exits 1: a regression (a cell pass -> FAIL, or certified -> not; the default), "
                          "any change (as diff does), or never")
    mrg = sub.add_parser("merge", help="join shard certificates (certify --shard K/N) into one")
    mrg.add_argument("certificates", nargs="+", metavar="CERT.json")
    mrg.add_argument("-o", dest="output", metavar="C.json", help="the merged certificate (required)")
    return p


def _pytest_args(a) -> list[str]:
    args = ["--pyargs", "normcert.properties.suite", "-p", "no:cacheprovider"]
    if a.command == "certify":
        for spec in a.impls:
            args += ["--normcert-impl", spec]
        for spec in (s for pair in a.agree for s in pair):
            args += ["--normcert-agree", spec]
        args += ["--hypothesis-profile", a.profile, "--normcert-seed", str(a.seed)]
        if a.certificate:
            args += ["--normcert-certificate", a.certificate]
        if a.bitwise:
            args.append("--normcert-bitwise")
        if a.require_backward:
            args.append("--normcert-require-backward")
        if a.failures_dir:
            args += ["--normcert-failures-dir", a.failures_dir]
        if a.kernel_timeout:
            args += ["--normcert-kernel-timeout", a.kernel_timeout]
        if a.domain is not None:
            args += ["--normcert-domain", a.domain]
        if a.compile:
            args.append("--normcert-compile")
        if a.workers:
            args += ["-n", a.workers]
        if a.shard:
            args += ["--normcert-shard", a.shard]
        args += [f"--normcert-property={p}" for p in a.property] + [f"--normcert-dtype={d}" for d in a.dtype]
        args += a.pytest_args
    else:
        args += ["--normcert-replay", a.file]
        for spec in a.impl:
            args += ["--normcert-impl", spec]
        if a.kernel_timeout:
            args += ["--normcert-kernel-timeout", a.kernel_timeout]
    if a.device:
        args += ["--normcert-device", a.device]
    return args


def verdict_table(results: list[dict]) -> list[str]:
    """Per implementation, property and dtype: pass / fail / not certified, and the worst error as a
    fraction of the error model's bound (what the verdict rests on; ulps of a value near zero mean
    little, and stay in the certificate)."""
    cells: dict[tuple, dict] = defaultdict(dict)
    for r in results:
        cells[(r["impl"], r["prop"])][r["dtype"]] = r
    dtypes = [d for d in verdict.DTYPE_ORDER if any(r["dtype"] == d for r in results)]
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
                units = r["worst_units"] if r["outcome"] in ("pass", "warn") else 0
                row.append(word.get(r["outcome"], r["outcome"]) + (f" {units:.3g} of bound" if units else ""))
        rows.append(tuple(row))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _list() -> int:
    from normcert.impls.__main__ import main as show  # noqa: PLC0415

    show()
    return 0


PLUGINS = (("_hypothesis_pytestplugin", "hypothesis"), ("xdist.plugin", "xdist"), ("xdist.looponfail", "xdist"),
           ("pytest_timeout", "pytest_timeout"), ("normcert.properties.run.plugin", "normcert"))
"""The pytest plugins the child loads, by module (and the top-level package that must be installed for
it): with autoloading off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), these and no others."""

BOOT = ("import os, sys, threading\n"
        "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != os.getcwd()]\n"
        "import pytest\n"
        "status = int(pytest.main())\n"
        "sys.stdout.flush(), sys.stderr.flush()\n"
        "if not [t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]:\n"
        "    os._exit(status)\n"
        "raise SystemExit(status)\n")
"""The child's lines: the folder it is started from off ``sys.path`` before anything is imported
(``python -c`` and ``PYTHONPATH=.`` put it there), so that a ``normcert/``, ``pytest/`` or ``*.dist-info``
there cannot stand in for the installed ones.  The kernel's own module is still found there
(``impls._import`` looks in the current folder for a module found nowhere else).  Once pytest has
returned (the run record written, its last step), the child leaves at once (``os._exit``): the
interpreter's teardown of torch, Hypothesis and the kernels' modules took longer than a small run's
checks, and no kernel code runs after the verdict.  A kernel's non-daemon thread still alive then
keeps the ordinary exit, which waits for it: the parent ends it after the kernel timeout (``_wait``)."""


def _child_config(folder: str) -> list[str]:
    """pytest's configuration for the child: normcert's own ini file (written in ``folder``), its
    rootdir at the installed package, no conftest.py, and the plugins of ``PLUGINS`` loaded by name:
    nothing of the folder the command is run from (a kernel repository's ``addopts = -k contract``
    once narrowed a certification run; a ``[pytest11]`` entry point in a ``*.dist-info`` there once
    loaded a plugin that passed failed reports)."""
    ini = os.path.join(folder, "pytest.ini")
    timeout = "timeout = 900\n" if importlib.util.find_spec("pytest_timeout") else ""
    with open(ini, "w") as f:
        f.write("[pytest]\naddopts = -rfE --import-mode=importlib\n"
                f"filterwarnings = ignore::DeprecationWarning\n{timeout}")
    package = os.path.dirname(importlib.util.find_spec("normcert.properties").origin)
    plugins = [a for module, top in PLUGINS if importlib.util.find_spec(top) for a in ("-p", module)]
    return ["-c", ini, "--rootdir", os.path.dirname(package), "--noconftest", *plugins]


def _grace(a) -> float:
    """How long the child may take to exit once its run has ended: the kernel timeout."""
    try:
        given = float(getattr(a, "kernel_timeout", None) or KERNEL_TIMEOUT)
    except ValueError:  # the child refuses it (exit status 4)
        return KERNEL_TIMEOUT
    return given if 0 < given < float("inf") else KERNEL_TIMEOUT


def _start(cmd: list[str], env: dict, stdout=None) -> subprocess.Popen:
    """The child, in a process group of its own: Ctrl-C at a terminal reaches this process alone,
    which hands it on once (``_wait``), so pytest in the child sees one interrupt, not two.  On
    Linux it is killed when this process dies (``PR_SET_PDEATHSIG``).  Its standard output (pytest's
    report) goes to ``stdout``, a file, where normcert's console speaks instead (None: this one's)."""
    return subprocess.Popen(cmd, env=env, stdout=stdout, preexec_fn=_orphan_proof)


def _orphan_proof() -> None:
    """In the child, before it runs: a process group of its own, and death with its parent (Linux)."""
    os.setpgrp()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass


def _end(child: subprocess.Popen) -> int:
    """Kill the child and its process group (xdist's workers too); its exit status."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        child.kill()
    return child.wait()


class _Relay:
    """The run's news (``properties.run.news``) written since the last call, whole events only, fed to
    normcert's console (``properties.presentation.console``); without one (pytest's own report shown,
    ``--pytest-output``) only a first counterexample is printed, the moment it is found."""

    def __init__(self, path: str, console=None):
        self.path, self.console, self.offset = path, console, 0

    def __call__(self) -> None:
        events, self.offset = read(self.path, self.offset)
        for event in events:
            if self.console is not None:
                self.console.feed(event)
            elif event["kind"] == "found":
                print(f"\nnormcert: {event['line']}", flush=True)
        if self.console is not None:
            self.console.tick()


def _wait(child: subprocess.Popen, record: str, heartbeat: str, grace: float, relay=None) -> tuple[int, str]:
    """The child's exit status, and what went wrong with its ending ("" if nothing).  A child that
    makes no progress (its ``heartbeat`` file untouched) for STALLED kernel timeouts is stuck in
    kernel code outside the watchdog (a finalizer, an exception's ``__str__``, an import) and is
    ended; so is one still alive ``grace`` seconds after its run ended.  A first Ctrl-C is handed to
    the child, which stops its run and writes an "interrupted" certificate; a second one ends it.
    (The whole step is guarded: Ctrl-C may land anywhere in it.)"""
    written = None
    interrupts = 0
    while True:
        try:
            if relay is not None:
                relay()
            try:
                return child.wait(timeout=0.1), ""
            except subprocess.TimeoutExpired:
                pass
            if written is None and os.path.exists(record):
                written = time.monotonic()
            if written is not None and time.monotonic() - written > grace:
                _end(child)
                return 0, (f"the kernel's process did not exit within {grace:g} s of the end of its run "
                           f"(a thread or finalizer of the kernel kept it alive): ended by normcert")
            silent = time.time() - os.path.getmtime(heartbeat)
            if written is None and silent > STALLED * grace:
                return _end(child), (f"the kernel's process made no progress for {silent:.0f} s ({STALLED} kernel "
                                     f"timeouts): stuck in kernel code outside the watchdog (a finalizer, an "
                                     f"exception's __str__, an import); ended by normcert")
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts > 1:
                return _end(child), "interrupted twice"
            child.send_signal(signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: passed to pytest as they are
    a = _parser().parse_args(argv[:cut])  # argparse exits 2 on bad usage; ``entry`` maps that to 4
    a.pytest_args = argv[cut + 1:]
    if a.command == "list":
        return _list()
    if a.command == "schema":
        from normcert.properties.evidence.certificate import schema  # noqa: PLC0415 - imports nothing heavy

        print(json.dumps(schema(), indent=1))
        return 0
    if a.command == "merge":
        from normcert.properties.presentation.merge_cli import merge  # noqa: PLC0415 - no torch

        return merge(a)
    if a.command in ("report", "compare"):
        from normcert.properties.presentation.report_cli import compare, report  # noqa: PLC0415 - no torch

        return report(a) if a.command == "report" else compare(a)
    if a.command == "replay" and a.export:
        return _export(a)
    if a.command == "certify" and not (a.impls or a.agree):
        print("normcert certify: give the kernels to certify, OP=MODULE:ATTR ..., or --agree OP=MODULE:ATTR "
              "OP=MODULE:ATTR", file=sys.stderr)
        return USAGE
    if a.command == "certify" and a.shard:
        from normcert.properties.evidence.shards import parse  # noqa: PLC0415 - imports nothing heavy

        try:
            parse(a.shard)
        except ValueError as e:
            print(f"normcert certify: {e}", file=sys.stderr)
            return USAGE
    if a.command == "certify" and a.workers and importlib.util.find_spec("xdist") is None:
        print(f"normcert certify: -n {a.workers} needs pytest-xdist, which is not installed here: "
              f"pip install pytest-xdist (or leave -n out)", file=sys.stderr)
        return USAGE
    if a.command == "certify":
        from normcert.properties.presentation.report_cli import check_certify  # noqa: PLC0415

        problem = check_certify(a.certificate, a.report)
        if problem:
            print(f"normcert certify: {problem}", file=sys.stderr)
            return USAGE
    # none of pytest's variables: PYTEST_ADDOPTS / PYTEST_PLUGINS would configure the run, and an
    # xdist worker's PYTEST_XDIST_WORKER (normcert run from a test) would make the child a worker
    # autoloading off: the child loads normcert's plugins by name (``PLUGINS``) and no others
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    certificate = os.path.abspath(a.certificate) if a.command == "certify" and a.certificate else None
    with tempfile.TemporaryDirectory(prefix="normcert-run-") as folder:
        record = env[RUN_RECORD] = os.path.join(folder, "record.json")
        heartbeat = env[HEARTBEAT] = os.path.join(folder, "heartbeat")
        news = env[NEWS] = os.path.join(folder, "news")
        open(heartbeat, "w").close()
        open(news, "w").close()
        cmd = [sys.executable, "-c", BOOT, *_child_config(folder), *_pytest_args(a)]
        console = None if a.pytest_output else Console(sys.stdout)
        relay = _Relay(news, console)
        log = os.path.join(folder, "pytest.log")
        with open(log, "wb") as out, _ends_with_us() as child:
            status, ending = _wait(child(cmd, env, None if a.pytest_output else out), record, heartbeat, _grace(a),
                                   relay)
        relay()  # what the run said last, before it exited
        if console is not None:
            console.close()
        try:
            with open(record) as f:
                run = json.load(f)
        except (OSError, ValueError):
            run = None
        if console is not None and (run is None or status not in (0, 1, USAGE)):
            _show(log)  # it ended other than by a verdict: what pytest said is the evidence
    if run is None:
        why = ending or f"the kernel's process exited with status {status} before normcert's end of run"
        if certificate and status != USAGE:  # a usage error was refused before the run began
            _incomplete(certificate, why)
            _report(certificate, a.report)
        if status in (USAGE, 2, 3):
            return status  # a usage error, Ctrl-C or pytest's internal error: pytest has said which
        print(f"normcert: not certified: {why}", file=sys.stderr)
        return 1
    return _judged(a, run, status, ending, certificate)


def _judged(a, run: dict, status: int, ending: str, certificate: str | None) -> int:
    """The exit status of a finished run, judged here from its rows (``verdict.judge``), not from the
    child's word: a certificate the child wrote "certified" against its own rows is corrected."""
    final = run["pytest_exit_status"]
    if a.command == "replay":
        if ending:
            print(f"normcert: {ending}", file=sys.stderr)
        held = final == 0 and status == 0 and not ending and run.get("replayed") == "pass"
        print("\nnormcert replay: " + ("the property holds on this case" if held else "the property still fails"
                                       if run.get("replayed") == "fail" else "the case was not replayed"))
        return 0 if held else (final or 1)
    state = _state(run, status, ending)
    judged, disagreement = verdict.judge(run["results"], run["expected"], final, run["crashed"], state,
                                         shard=run.get("shard"))
    disagreement = disagreement or run.get("disagreement", "")
    if certificate and (judged != run["verdict"] or state != run["run"]):
        _correct(certificate, judged, disagreement, state)
    if certificate:
        _summarise(certificate)
    if run["results"]:
        from normcert.properties.evidence.certificate import claimed, verdict_line  # noqa: PLC0415

        line = verdict_line(judged, claimed(run["domains"], run["results"]), run["scope"], state,
                            getattr(a, "profile", None), run.get("shard"))
        print("\nnormcert verdict: " + line)
        print("\n".join(verdict_table(run["results"])))
    if disagreement:
        print(f"normcert: {disagreement}", file=sys.stderr)
    if ending:
        print(f"normcert: {ending}", file=sys.stderr)
    if not run["results"]:
        print("normcert: nothing was checked", file=sys.stderr)
    if certificate:
        _report(certificate, a.report)
    if judged in verdict.PASSED:  # a shard's "shard passed" too: merging its certificate judges the whole
        return 0
    return final if final not in (0, NO_TESTS) else 1


def _show(log: str) -> None:
    """pytest's report of a run that ended other than by a verdict (interrupted, an internal error,
    killed): normcert's console holds no more than its events, and pytest's words say where it stopped."""
    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        return
    if text.strip():
        print("normcert: pytest's report of the run:\n" + text.rstrip("\n"), file=sys.stderr)


def _export(a) -> int:
    """``replay FILE --export REPRO.py``: the reproducer (``properties.evidence.reproducer``)."""
    from normcert.properties.evidence import reproducer  # noqa: PLC0415 - torch only for this command
    from normcert.properties.evidence.replay import ReplayError  # noqa: PLC0415

    try:
        print(reproducer.export(a.file, a.export, a.impl))
    except (ReplayError, reproducer.ExportError) as e:
        print(f"normcert replay: {e}", file=sys.stderr)
        return USAGE
    return 0


def _summarise(certificate: str) -> None:
    """The CI job summary (``$GITHUB_STEP_SUMMARY``) from the certificate as judged here."""
    from normcert.properties.evidence.certificate import append_step_summary, summary_path  # noqa: PLC0415

    if not summary_path():  # no CI job summary asked for: nothing to read the certificate for
        return
    try:
        with open(certificate) as f:
            append_step_summary(json.load(f))
    except (OSError, ValueError, KeyError) as e:
        print(f"normcert: the CI job summary was not written ({e})", file=sys.stderr)


def _report(certificate: str, path: str | None) -> None:
    """``certify --report PATH``: the HTML report of the certificate as judged here (a failure to
    write it is said, and does not change the verdict)."""
    if not path:
        return
    from normcert.properties.presentation.report_cli import write_report  # noqa: PLC0415

    problem = write_report(certificate, path)
    print(f"normcert: the report was not written: {problem}" if problem else f"normcert: report: {path}",
          file=sys.stderr if problem else sys.stdout)


def _incomplete(certificate: str, why: str) -> None:
    from normcert.properties.evidence.certificate import write_incomplete  # noqa: PLC0415

    try:
        write_incomplete(certificate, why)
    except OSError as e:
        print(f"normcert: the certificate {certificate} could not be written ({e.strerror or e})", file=sys.stderr)


def _state(run: dict, status: int, ending: str) -> str:
    """The run's state as the certificate records it: the child's (``run["run"]``), with ", but then
    <what>" where its process did not end as its run said (``ending``: kept alive past the kernel
    timeout and ended here; or an exit status other than pytest's).  The verdict is judged from this
    state (``verdict.judge``: only "complete" certifies), so ``compare`` and ``merge``, judging the
    certificate again, find the same verdict."""
    if ending:
        return f"{run['run']}, but then {ending}"
    if status != run["pytest_exit_status"]:
        return (f"{run['run']}, but then the kernel's process exited with status {status} after its run "
                f"(pytest's exit status: {run['pytest_exit_status']})")
    return run["run"]


def _correct(certificate: str, judged: str, disagreement: str, state: str) -> None:
    """Rewrite the certificate's verdict and run state where the child's differ from this process's."""
    from normcert.properties.evidence.certificate import write_files  # noqa: PLC0415

    try:
        with open(certificate) as f:
            cert = json.load(f)
        cert.update(run=state, verdict=judged, disagreement=disagreement or (
            "" if state != cert.get("run") else "the run's own verdict differed from its result rows; corrected "
                                                "by normcert's parent process"))
        write_files(certificate, cert)
    except (OSError, ValueError, KeyError):
        _incomplete(certificate, "the run's certificate disagreed with its result rows and could not be corrected")


@contextlib.contextmanager
def _ends_with_us():
    """Start the child (``_start``) so that it ends with this process: SIGTERM or SIGHUP here (what
    ``timeout`` and CI runners send) ends the child's whole process group, xdist's workers too, then
    this process; on Linux the child is also sent SIGKILL if this process dies without a word."""
    started = []

    def stop(signum, frame):
        for child in started:
            _end(child)
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield lambda cmd, env, stdout=None: started.append(_start(cmd, env, stdout)) or started[-1]
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def entry() -> None:
    try:
        code = main()
    except SystemExit as e:  # argparse: usage errors exit 2; normcert's usage status is 4
        code = USAGE if e.code == 2 else e.code
    raise SystemExit(code)
