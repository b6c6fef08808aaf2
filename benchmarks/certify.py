#!/usr/bin/env python
"""A certify run's fixed cost: end-to-end wall time of ``normcert certify``, split, beside ``import torch``.

For the README's ``mykern.py`` and four planted bugs (eager RMSNorm kernels), each at two scopes
(``one``: ``--property accuracy --dtype float32``; ``full``: every property and dtype), and the
README's kernel at full scope with ``-n 2``, this runs ``normcert certify`` from a fresh folder
outside the clone and splits its wall time T into

    startup    the command's start to the first test's start (interpreters, imports, collection)
    probes     the kernels' sample probes (``probes.on_sample``) and the native oracle's build
    families   the tests themselves, less the probes inside them (per family in a second table)
    teardown   the last test's end to the command's exit (certificate, verdict, exit)

and T / t_torch, with t_torch the wall time of ``python -c "import torch"`` measured in the same
repeat (the median of the per-repeat ratios).  "first fail" is when the first "fails for" line (a counterexample) was printed.  Each number
is the median over ``--repeats`` repeats, the variants interleaved within a repeat, since the machine
may be shared with other work (the header says its load).  ``--before DIR`` adds a variant run from
another normcert installed in DIR (``pip install --no-deps --target DIR normcert-*.whl`` of an
earlier commit): the same table before and after a change, in one run.

    python benchmarks/certify.py                           # this install, 3 repeats
    python benchmarks/certify.py --before /tmp/nc-main --after /tmp/nc-new --repeats 5
    python benchmarks/certify.py --scopes one --kernels mykern
"""
from __future__ import annotations

import argparse
import builtins
import functools
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

MYKERN = '''import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(compute)
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv_rms * weight.to(compute)).to(x.dtype)
'''

PLANTED = "normcert.properties.tests.meta.planted"
KERNELS = {"mykern": "rms_norm=mykern:rms_norm",  # the README's, correct
           "eps_outside_sqrt": f"rms_norm={PLANTED}:rms_eps_outside_sqrt",
           "no_upcast": f"rms_norm={PLANTED}:rms_no_upcast",
           "clamped_mean_square": f"rms_norm={PLANTED}:rms_clamped_mean_square",
           "float64_inside": f"rms_norm={PLANTED}:rms_float64_inside"}
SCOPES = {"one": ["--property", "accuracy", "--dtype", "float32"], "full": [], "full -n 2": ["-n", "2"]}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}; "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def import_torch(env) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
    return time.perf_counter() - start


def certify(spec: str, scope: list[str], folder: Path, env: dict) -> dict:
    """One ``normcert certify`` run, timed: its wall time, split, and when the first counterexample was printed."""
    times = folder / f"times-{time.monotonic_ns()}"
    env = dict(env, NORMCERT_BENCH_TIMES=str(times),
               PYTHONPATH=os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HERE)) if p))
    cmd = [sys.executable, "-m", "normcert", "certify", spec, *scope, "--failures-dir", str(folder / "failures"),
           "--", "-p", "certify_timing"]
    start = time.time()
    child = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_fail = None
    for line in child.stdout:
        if first_fail is None and " fails for " in line:
            first_fail = time.time() - start
    status = child.wait()
    end = time.time()
    records = [json.load(open(f)) for f in glob.glob(f"{times}.*.json")]
    main = next((r for r in records if r["tests"]), None)
    if main is None:
        raise SystemExit(f"no timing record from {' '.join(cmd)} (exit {status})")
    tests = [t for t in main["tests"] if t[1] is not None]
    spans = [s for r in records for key in ("probes", "native") for s in r[key]]
    families: dict[str, float] = {}
    for nodeid, a, b in tests:
        family = re.search(r"::test_(\w+)", nodeid).group(1)
        inside = sum(min(b, e) - max(a, s) for s, e in spans if s < b and e > a)
        families[family] = families.get(family, 0.0) + (b - a) - inside
    first, last = min(t[1] for t in tests), max(t[2] for t in tests)
    return {"status": status, "total": end - start, "startup": first - start, "teardown": end - last,
            "probes": sum(e - s for s, e in spans), "families": families, "first_fail": first_fail}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--before", metavar="DIR", help="also run the normcert installed in DIR (pip install --target DIR)")
    p.add_argument("--after", metavar="DIR", help="run the normcert installed in DIR as 'after' (default: this environment's)")
    p.add_argument("--kernels", nargs="+", choices=tuple(KERNELS), default=list(KERNELS))
    p.add_argument("--scopes", nargs="+", choices=tuple(SCOPES), default=list(SCOPES))
    a = p.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_", "NORMCERT_"))}
    variants = {"after": dict(base, PYTHONPATH=os.path.abspath(a.after)) if a.after else base}
    if a.before:
        variants = {"before": dict(base, PYTHONPATH=os.path.abspath(a.before)), **variants}
    runs = [(k, s) for k in a.kernels for s in a.scopes if s != "full -n 2" or k == "mykern"]
    print(f"machine: {machine()} (shared: medians of {a.repeats} repeats, variants interleaved)")
    got: dict[tuple, list] = {}
    torch_times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="normcert-bench-") as tmp:
        folder = Path(tmp)
        (folder / "mykern.py").write_text(MYKERN)
        (folder / "pytest.ini").write_text("[pytest]\naddopts = -k nothing\n")  # the user's own, ignored by certify
        for k in range(a.repeats):
            torch_times.append(import_torch(base))
            for kernel, scope in runs:
                for name, env in variants.items():
                    r = dict(certify(KERNELS[kernel], SCOPES[scope], folder, env), torch=torch_times[-1])
                    got.setdefault((name, kernel, scope), []).append(r)
                    print(f"  {name} {kernel} {scope}: exit {r['status']}, {r['total']:.2f} s, startup {r['startup']:.2f} s, "
                          f"torch {torch_times[-1]:.2f} s", file=sys.stderr, flush=True)
            if k + 1 < a.repeats:  # the tables so far, on standard error: a long run cut short still says something
                report(got, torch_times, variants, a.kernels, file=sys.stderr)
    report(got, torch_times, variants, a.kernels)


def report(got: dict, torch_times: list, variants, kernels, file=None) -> None:
    """The tables: each run's median split and ratio to ``import torch``, the median full-scope total
    over the kernels, and the README's kernel's families at full scope."""
    print = functools.partial(builtins.print, file=file)  # noqa: A001 - the tables go to ``file``
    t_torch = statistics.median(torch_times)
    print(f'python -c "import torch": {t_torch:.2f} s (median; min {min(torch_times):.2f} s)\n')
    head = ("variant", "kernel", "scope", "exit", "total s", "x torch", "startup", "probes", "families", "teardown",
            "first fail")
    rows = [head]
    for (name, kernel, scope), rs in got.items():
        fam = median([sum(r["families"].values()) for r in rs])
        ff = median([r["first_fail"] for r in rs])
        total = median([r["total"] for r in rs])
        rows.append((name, kernel, scope, str(rs[0]["status"]), f"{total:.2f}", f"{median([r['total'] / r['torch'] for r in rs]):.2f}",
                     f"{median([r['startup'] for r in rs]):.2f}", f"{median([r['probes'] for r in rs]):.2f}",
                     f"{fam:.2f}", f"{median([r['teardown'] for r in rs]):.2f}", "-" if ff is None else f"{ff:.2f}"))
    _table(rows, print)
    for name in variants:
        planted = [median([r["total"] for r in got[(name, k, "full")]]) for k in kernels if (name, k, "full") in got]
        if planted:
            print(f"\n{name}: median full-scope total over {len(planted)} kernels: {statistics.median(planted):.2f} s "
                  f"({statistics.median(planted) / t_torch:.2f} x import torch)")
    fams = sorted({f for rs in got.values() for r in rs for f in r["families"]})
    full = [key for key in got if key[1] == "mykern" and key[2] == "full"]
    if full:
        print("\nper family, the README's kernel at full scope (median s):")
        _table([("family", *(k[0] for k in full))] +
               [(f, *(f"{median([r['families'].get(f, 0.0) for r in got[k]]):.2f}" for k in full)) for f in fams], print)


def _table(rows, print) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


if __name__ == "__main__":
    main()
