"""normcert's console: what ``normcert certify`` and ``replay`` print while the run goes on.

The run tells its events (``run.news``: the header, each test as it starts, each (kernel, property,
dtype) cell as it finishes, each failure, the plugin's notes, a property's first counterexample) and
the command feeds them here as they come (``cli._wait``):

    normcert 0.1.0 certify: rms_norm:mykern:rms_norm (op rms_norm) on cpu, profile ci, seed 0
      scope: every property, every dtype; 37 checks
    [ 1/37] pass  accuracy float64  0.289 of bound
    [ 2/37] FAIL  extremes float64  y[1]: got 0.99999678, exact 0.99999671, |error| 6.88e-08 > bound 1.72e-15 ...

then every failure once, as a block (its message: the case, its calling context, the replay
command), before the verdict and the table (``cli._judged``).  Checks that do not apply to the op
are never listed, so they count for nothing; a cell that is "not certified" (a dtype the kernel
refuses) is one of the run's checks, and counts.

On a terminal (standard output a TTY, ``TERM`` not ``dumb``) one more line is redrawn in place below
the others, a progress bar: the checks done of the run's total, the test running now and an estimate
of the time left: with d of N checks done, the d-th at time t_d since the start, at time t

    left = (t_d / d) (N - d) - min(t - t_d, t_d / d)

the mean time of a finished check times the checks left, less what the running one has had (at most
one mean): it falls while a check runs, where (t / d) (N - d) would grow with t until the next
check finished (a 30 s cell of an interpreted Triton kernel raised it by 30 (N - d) / d s).  With colour unless
``NO_COLOR`` is set.  Anywhere else (a file, a pipe, a CI log) only whole plain lines are written, no
control character: the bar is never drawn there.  Plain ANSI sequences, no terminal library: rich is
not a dependency of normcert, and pytest's own reporter writes to the run's process, whose output the
command keeps out of sight; one line redrawn needs ``\\r`` and "erase line" alone.
"""
from __future__ import annotations

import os
import shutil
import time

OUTCOME = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "warn": "warn", "expected-fail": "xfail",
           "not-supported": "not certified", "not-certified": "not certified (forward only)", "not-run": "FAIL"}
"""A cell's outcome in the console's words, as the verdict table says them."""

COLOUR = {"pass": "32", "FAIL": "31;1", "ERROR": "31;1", "warn": "33"}


def interactive(stream) -> bool:
    """Is ``stream`` a terminal a progress bar may be redrawn on?"""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # a closed or odd stream: plain lines
        return False


class Console:
    """Prints the run's events to ``out`` as they are fed; a progress bar only where ``live``."""

    def __init__(self, out, live: bool | None = None, clock=time.monotonic):
        self.out = out
        self.live = interactive(out) if live is None else live
        self.colour = self.live and not os.environ.get("NO_COLOR")
        self.clock = clock
        self.started = clock()
        self.finished = self.started  # when the last check finished
        self.total = 0
        self.done: set[tuple] = set()
        self.several = True  # more than one kernel: each line names its kernel
        self.running: list[str] = []
        self.failures: list[dict] = []
        self.kernels: list[str] = []
        self.bar = ""  # the bar drawn on the last line now ("" none)

    # ------------------------------------------------------------------ events
    def feed(self, event: dict) -> None:
        """One event of the run (``run.news``)."""
        kind = event.get("kind")
        if kind == "start":
            self._header(event)
        elif kind == "begin":
            self.running.append(event["test"])
        elif kind == "end":
            if event["test"] in self.running:
                self.running.remove(event["test"])
        elif kind == "cell":
            self._cell(event)
        elif kind == "failure":
            self.failures.append(event)
        elif kind == "note":
            self.line(event["line"])
        elif kind == "found":
            self.line("normcert: " + event["line"])
        self.tick()

    def _header(self, e: dict) -> None:
        self.total = e["cells"]
        self.kernels = e["kernels"]
        self.several = len(e["kernels"]) > 1
        self.started = self.finished = self.clock()  # the checks' time, not Python's, torch's and the workers' start
        ops = ", ".join(e["ops"])
        if e.get("replay"):  # the file holds the case: no profile or seed draws it
            self.line(f"normcert {e['version']} replay {e['replay']}: {e['property']} for {e['kernels'][0]} "
                      f"(op {ops}) on {e['device']}")
            self.line(f"  case: {e['case']}")
            return
        self.line(f"normcert {e['version']} certify: {', '.join(e['kernels'])} (op{'s' * (len(e['ops']) > 1)} "
                  f"{ops}) on {e['device']}, profile {e['profile']}, seed {e['seed']}")
        scope = e["scope"]
        words = [("every property" if scope["properties"] == "all" else "properties " + ", ".join(scope["properties"])),
                 ("every dtype" if scope["dtypes"] == "all" else "dtypes " + ", ".join(scope["dtypes"]))]
        shard = f", shard {e['shard']}" if e.get("shard") else ""
        self.line(f"  scope: {', '.join(words)}{shard}; {e['cells']} check{'s' * (e['cells'] != 1)}")

    def _cell(self, e: dict) -> None:
        self.done.add((e["impl"], e["prop"], e["dtype"]))
        self.finished = self.clock()
        word = OUTCOME.get(e["outcome"], e["outcome"])
        if e["outcome"] in ("pass", "warn") and e.get("units"):
            detail = f"{e['units']:.3g} of bound"
        else:
            detail = e.get("message", "")
        name = " ".join(p for p in (e["prop"], e["dtype"]) if p)
        width = len(str(self.total))
        count = f"[{min(len(self.done), self.total):>{width}}/{self.total}]"
        shown = self._paint(f"{word:<4}", COLOUR.get(word))
        kernel = f"  {e['impl']}" if self.several else ""
        self.line(f"{count} {shown}  {name}{kernel}" + (f"  {detail}" if detail else ""))

    # ------------------------------------------------------------------ output
    def line(self, text: str) -> None:
        """One whole line, above the bar where one is drawn."""
        self._clear()
        self.out.write(text + "\n")
        self.out.flush()
        self.tick()

    def tick(self) -> None:
        """Redraw the progress bar (on a terminal, once the run has said its size) where it changed."""
        if not self.live or not self.total:
            return
        bar = self._bar(shutil.get_terminal_size().columns)
        if bar != self.bar:
            self._clear()
            self.out.write(bar)
            self.out.flush()
            self.bar = bar

    def _bar(self, columns: int) -> str:
        done = min(len(self.done), self.total)
        now = self.clock()
        elapsed = now - self.started
        mean = (self.finished - self.started) / done if done else 0.0
        left = (f"~{_clock(mean * (self.total - done) - min(now - self.finished, mean))} left"
                if done < self.total else "judging") if done else "estimating"
        test = ""
        if self.running:  # the test started last (with -n, others run beside it)
            test = self.running[-1] if self.several else self.running[-1].replace(f" {self.kernels[0]}", "")
            test += f" (+{len(self.running) - 1})" if len(self.running) > 1 else ""
        cells = 20
        full = round(cells * done / self.total)
        text = f"[{'#' * full}{'.' * (cells - full)}] {done}/{self.total} checks  {_clock(elapsed)}, {left}  {test}"
        return text[:max(columns - 1, 0)]

    def _clear(self) -> None:
        if self.bar:
            self.out.write("\r\x1b[K")
            self.bar = ""

    def _paint(self, text: str, code: str | None) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text

    def close(self) -> None:
        """The run has ended: the bar goes, and each failure is printed once, as pytest held it."""
        self._clear()
        self.live = False
        for f in self.failures:
            self.out.write(f"\n{self._paint('FAILED', COLOUR['FAIL'])} {f['test']}"
                           + (f" ({f['when']})" if f.get("when") not in (None, "call") else "") + "\n")
            self.out.write(f["text"].rstrip("\n") + "\n")
        self.out.flush()


def _clock(seconds: float) -> str:
    """``seconds`` as m:ss (h:mm:ss past an hour)."""
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
