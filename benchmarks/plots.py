"""The benchmarks' tables drawn as figures (``--plot PATH`` of ``tightness.py`` and ``oracle.py``).

matplotlib is the optional ``plots`` extra (``pip install "normcert[plots]"``), imported only here
and only when a figure is asked for; ``require`` turns its absence into one line for argparse.

    tightness(worst, path)  worst error / bound of a correct kernel, per op (x axis) and dtype
                            (marker), one panel per family, on a log scale with the pass line at 1:
                            a point above the line is a correct kernel rejected, and the distance
                            below it is the slack the error model leaves (1 / worst)
    oracle_cost(points, path)  milliseconds per oracle call against elements (rows x n), log-log,
                            one panel per path, one line per op (measured calls only: the
                            naive baseline's scaled estimates and skipped calls are left out)

The figure's format follows the extension of ``path`` (.svg, .png, .pdf).  Each function returns
the Figure it saved, so a test can read its artists.
"""
from __future__ import annotations

from collections import defaultdict

FLOOR = 1e-4  # worst error / bound is drawn at least here on the log axis (an exact kernel's 0)
DTYPE_MARKERS = {"float64": "o", "float32": "s", "float16": "^", "bfloat16": "D"}


def require() -> str:
    """"" where matplotlib can be imported, else the one-line reason (for ``parser.error``)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, the plots extra: pip install \"normcert[plots]\""
    return ""


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on a CI machine
    from matplotlib import pyplot
    return pyplot


def tightness(worst: dict, path: str, title: str = ""):
    """``worst``: (op, dtype, family) -> the largest error / bound a correct kernel showed."""
    plt = _pyplot()
    families = sorted({k[2] for k in worst})
    ops = sorted({k[0] for k in worst})
    fig, axes = plt.subplots(len(families), 1, figsize=(max(6.0, 0.45 * len(ops) + 2), 3.2 * len(families)),
                             squeeze=False, sharex=True)
    for ax, family in zip(axes[:, 0], families):
        for dtype, marker in DTYPE_MARKERS.items():
            xs = [ops.index(op) for (op, d, f) in worst if d == dtype and f == family]
            ys = [max(v, FLOOR) for (op, d, f), v in worst.items() if d == dtype and f == family]
            if xs:
                ax.scatter(xs, ys, marker=marker, label=dtype, alpha=0.8)
        ax.axhline(1.0, color="crimson", linewidth=1.2, label="bound (fails above)")
        ax.set_yscale("log")
        ax.set_ylabel(f"{family}\nworst error / bound")
        ax.grid(True, axis="y", which="major", alpha=0.3)
    axes[-1, 0].set_xticks(range(len(ops)), ops, rotation=60, ha="right", fontsize=8)
    axes[0, 0].legend(fontsize=7, ncol=5, loc="lower left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return fig


def oracle_cost(points: list, path: str, title: str = ""):
    """``points``: (op, path, elements, milliseconds) for every timed call (skipped ones left out)."""
    plt = _pyplot()
    order = ("naive", "mpmath", "float64", "torch float64")
    paths = sorted({p[1] for p in points}, key=lambda p: (order.index(p) if p in order else len(order), p))
    fig, axes = plt.subplots(1, len(paths), figsize=(5.0 * len(paths), 4.2), squeeze=False, sharex=True, sharey=True)
    for ax, which in zip(axes[0], paths):
        lines = defaultdict(list)
        for op, p, elements, ms in points:
            if p == which:
                lines[op].append((elements, ms))
        for op, xy in sorted(lines.items()):
            xy.sort()
            ax.plot([e for e, _ in xy], [m for _, m in xy], marker=".", linewidth=1, label=op)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(which, fontsize=9)
        ax.set_xlabel("elements (rows x n)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0, 0].set_ylabel("ms per call")
    axes[0, -1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return fig
