"""The benchmarks' figures (``benchmarks/plots.py``, ``--plot``): what a reader looks at holds what
the table says: one point per (op, dtype, family) at its worst error / bound with the pass line at
1, and one line per (op, path) through its measured times."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the plots extra (matplotlib) is not installed")

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "plots.py"


@pytest.fixture(scope="module")
def plots():
    if not HERE.exists():
        pytest.skip("benchmarks/ is not beside this checkout's properties/ (an installed copy)")
    spec = importlib.util.spec_from_file_location("normcert_benchmark_plots", HERE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tightness_figure_has_a_point_per_cell_at_its_worst_and_the_pass_line_at_one(plots, tmp_path):
    worst = {("rms_norm", "float32", "accuracy"): 0.4, ("rms_norm", "bfloat16", "accuracy"): 0.0,
             ("layer_norm", "float32", "accuracy"): 1.5, ("rms_norm", "float32", "gradients"): 0.02}
    fig = plots.tightness(worst, str(tmp_path / "t.svg"))
    acc, grads = fig.axes
    drawn = sorted(float(y) for c in acc.collections for _, y in c.get_offsets())
    assert drawn == [plots.FLOOR, 0.4, 1.5]  # an exact kernel's 0 at the floor of the log axis
    assert [float(y) for c in grads.collections for _, y in c.get_offsets()] == [0.02]
    assert all(any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.lines) for ax in (acc, grads))
    assert (tmp_path / "t.svg").read_text().startswith("<?xml")


def test_the_oracle_figure_draws_one_line_per_op_and_path_through_its_times(plots, tmp_path):
    points = [("rms_norm", "float64", 512, 0.8), ("rms_norm", "float64", 65536, 1.0),
              ("rms_norm", "mpmath", 512, 20.0), ("silu_and_mul", "float64", 512, 0.2)]
    fig = plots.oracle_cost(points, str(tmp_path / "o.png"))
    mpmath, f64 = fig.axes[0], fig.axes[1]
    assert [ax.get_title() for ax in fig.axes] == ["mpmath", "float64"]
    assert sorted((line.get_label(), list(line.get_ydata())) for line in f64.lines) == \
        [("rms_norm", [0.8, 1.0]), ("silu_and_mul", [0.2])]
    assert [list(line.get_xdata()) for line in mpmath.lines] == [[512]]
    assert (tmp_path / "o.png").read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_option_is_refused_in_one_line(plots, monkeypatch):
    import builtins
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "matplotlib" else real(name, *a, **k))
    assert plots.require() == '--plot needs matplotlib, the plots extra: pip install "normcert[plots]"'
