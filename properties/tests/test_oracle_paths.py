"""The float64 oracle's two extraction paths: native kernels (``oracle/native.c``) and pure torch.

* Bit-identical on hard rows: row_sum, row_dot, inv_rms (correctly rounded on
  both paths), row_peak, scaled_sum, and the forward and VJP of the ops made of
  those alone.  ``center`` is accurate to 4 u max|d| on both paths but its
  low-order bits depend on a summation order (``oracle/float64_backend.py``), so
  the two paths are held to twice that; ``test_oracle.test_paths_agree`` checks
  every op against mpmath on each path.
* With no C compiler, or with ``NORMCERT_ORACLE_NATIVE=0``, the pure path runs,
  ``native.status()`` says why, and a fallback warns once.
* The self-test rejects kernels that break the contract the certified sums
  rely on, and accepts the pure path's own maths.
* The build is reproducible (the same sha256 from two builders at once), leaves nothing behind,
  and a library planted in the cache by an earlier run is not loaded by a later one.
Where no C compiler works, the tests that need the native kernels skip.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from ... import oracle
from ...oracle import eft, native
from ...oracle.backends import F64

from .extraction import extraction, need_native

U = 2.0 ** -53


def hard_rows(n: int) -> np.ndarray:
    """Rows that stress every branch of the reductions, each of length n."""
    rng = np.random.default_rng(n)
    r = lambda: rng.standard_normal(n)  # noqa: E731
    e = lambda lo, hi: 2.0 ** rng.integers(lo, hi, n)  # noqa: E731
    cancel = r() * e(0, 60)
    cancel[1::2] = -cancel[::2][: n // 2]
    rows = [
        r(),
        r() * e(-60, 60),  # huge dynamic range
        r() + 1e6,  # |mean| >> std
        cancel + r() * 1e-3,  # complete cancellation of the big terms, then small ones
        r() * 1e307,  # sums and squares overflow: scaled rows
        r() * 2.0 ** 600,  # products overflow
        r() * 2.0 ** -600,  # products underflow
        r() * 1e-310,  # subnormal
        r() * e(-1074, -1000),  # subnormal and tiny normal
        r() * e(-1070, 1000),  # the whole range
        np.full(n, 3.25),  # constant
        np.zeros(n),
        np.r_[1.0, np.full(n - 1, 2.0 ** -53)] if n > 1 else np.ones(1),  # ties
    ]
    special = r()
    special[0] = np.nan
    rows.append(special)
    for v in (np.inf, -np.inf):
        special = r()
        special[-1] = v
        rows.append(special)
    both = r()
    both[0], both[-1] = np.inf, -np.inf
    rows.append(both)
    return np.array(rows)


def same_bits(a, b) -> bool:
    """Same shape and bits (±0 told apart); any NaN matches any NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nan = np.isnan(a)
    return a.shape == b.shape and np.array_equal(nan, np.isnan(b)) and np.array_equal(
        a.view(np.int64)[~nan], b.view(np.int64)[~nan])


def _reductions(x, y):
    with np.errstate(all="ignore"):
        return {"row_sum": F64.row_sum(x), "row_dot": F64.row_dot(x, y), "squares": F64.row_dot(x, x),
                "inv_rms": F64.inv_rms(x, 1e-6), "row_peak": F64.row_peak(x),
                "scaled_sum": F64.scaled_sum(x, y)[0], "center": F64.center(x)}


@pytest.mark.parametrize("n", [1, 7, 37, 1000])
def test_native_and_pure_reductions_agree(n):
    """Bit for bit, but for center: within twice its bound (4 u max|d| each)."""
    need_native()
    x = hard_rows(n)
    y = hard_rows(n + 1)[:, ::-1][:, :n].copy() if n > 1 else hard_rows(2)[:, :1]
    for layout, a, b in (("contiguous", x, y), ("transposed", np.asfortranarray(x), np.asfortranarray(y))):
        got = _reductions(a, b)
        with native.pure():
            want = _reductions(a, b)
        for name in got:
            if name == "center":
                continue
            assert same_bits(got[name], want[name]), f"{name} ({layout}, n={n}): native and pure paths differ"
        (dn, mn), (dp, mp) = got["center"], want["center"]
        fin, mfin = np.isfinite(dp), np.isfinite(mp)
        assert np.array_equal(np.isfinite(dn), fin) and same_bits(dn[~fin], dp[~fin]), f"center d ({layout}, n={n})"
        assert same_bits(mn[~mfin], mp[~mfin]), f"center mean ({layout}, n={n})"
        with np.errstate(all="ignore"):
            tol = 2 * (4 * U * np.max(np.where(fin, np.abs(dp), 0.0), axis=-1, keepdims=True) + 2.0 ** -1072)
            assert np.all((np.abs(dn - dp) <= tol)[fin]), f"center d ({layout}, n={n}): paths differ beyond the bound"
            assert np.all((np.abs(mn - mp) <= tol)[mfin]), f"center mean ({layout}, n={n})"


def _args(op, x, rng):
    n = x.shape[-1]
    w = torch.from_numpy(rng.standard_normal(n)).to(x.dtype)
    if op == "rms_norm":
        return dict(x=x, weight=w, eps=1e-6)
    if op == "add_rms_norm":
        return dict(x=x, residual=x.flip(0).clone(), weight=w, eps=1e-6)
    if op == "swiglu":
        return dict(gate=x, up=x.flip(-1).clone())
    return dict(x=torch.cat([x, x.flip(0)], -1))  # silu_and_mul


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "swiglu", "silu_and_mul"])
def test_native_and_pure_ops_are_bit_identical(op):
    """The ops made of correctly rounded reductions and elementwise maths only: forward and VJP."""
    need_native()
    for n in (5, 300):
        rng = np.random.default_rng(n)
        for dtype in (torch.float64, torch.float32):
            x = torch.from_numpy(hard_rows(n)).to(dtype)
            args = _args(op, x, rng)
            outs = {}
            for kind in ("native", "pure"):
                with extraction(kind), np.errstate(all="ignore"):
                    fwd = oracle.forward(op, **args)
                    cot = tuple(torch.from_numpy(np.random.default_rng(1).standard_normal(o.shape)) for o in fwd)
                    outs[kind] = (*fwd, *oracle.vjp(op, cot, **args).values())
            for i, (a, b) in enumerate(zip(outs["native"], outs["pure"])):
                assert same_bits(a, b), f"{op} n={n} {dtype}: output {i} differs between the native and pure paths"


# ---------------------------------------------------------------------------
# choosing the path


def forget_choice(monkeypatch, tmp_path):
    """Make native choose its path again, from the environment as patched (all undone after the test)."""
    monkeypatch.setattr(native, "_chosen", [])
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setenv("NORMCERT_CACHE", str(tmp_path / "cache"))


def _rms(x):
    return oracle.forward("rms_norm", x=x, weight=torch.ones(x.shape[-1], dtype=x.dtype), eps=1e-6)[0]


def test_without_a_compiler_the_pure_path_runs_and_says_why(monkeypatch, tmp_path):
    x = torch.from_numpy(hard_rows(37))
    with np.errstate(all="ignore"):
        want = _rms(x)  # on the path this process chose
    forget_choice(monkeypatch, tmp_path)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    with pytest.warns(RuntimeWarning, match=r"native kernels are unavailable \(no C compiler"):
        assert native.kernels() is None
    assert native.status() == native.Status(False, "no C compiler: CC is not set and none of cc, gcc, clang "
                                                   "is on PATH")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the choice is made once per process
        with np.errstate(all="ignore"):
            assert same_bits(_rms(x), want)


def test_a_failing_compiler_is_reported_with_its_message(monkeypatch, tmp_path):
    forget_choice(monkeypatch, tmp_path)
    monkeypatch.setenv("CC", f"{shlex.quote(sys.executable)} -c 'import sys; sys.stderr.write(\"cc: no licence\"); "
                             f"sys.exit(3)'")
    with pytest.warns(RuntimeWarning, match="exited with status 3: cc: no licence"):
        status = native.status()
    assert not status.native and "native.c exited with status 3: cc: no licence" in status.reason


def test_the_environment_variable_forces_the_pure_path(monkeypatch, tmp_path):
    forget_choice(monkeypatch, tmp_path)
    monkeypatch.setenv(native.ENV, "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deliberate choice: no warning
        assert native.status() == native.Status(False, "NORMCERT_ORACLE_NATIVE=0")
        assert native.kernels() is None
    forget_choice(monkeypatch, tmp_path)
    monkeypatch.setenv(native.ENV, "no")
    with pytest.raises(ValueError, match="NORMCERT_ORACLE_NATIVE='no': expected 0"):
        native.kernels()


def test_native_kernels_load_where_a_compiler_exists():
    """A machine with a C compiler must not quietly lose the native path (a broken build or self-test)."""
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine")
    if os.environ.get(native.ENV) == "0":
        pytest.skip(f"{native.ENV}=0")
    status = native.status()
    assert status.native, status.reason


def test_a_failed_self_test_falls_back_with_a_warning(monkeypatch, tmp_path):
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine")
    forget_choice(monkeypatch, tmp_path)
    monkeypatch.setattr(native, "self_test", lambda k: "planted failure")
    with pytest.warns(RuntimeWarning, match="failed its self-test: planted failure"):
        assert native.kernels() is None
    assert "failed its self-test: planted failure" in native.status().reason


# ---------------------------------------------------------------------------
# the self-test


class TorchKernels:
    """The kernels' contract computed the pure path's way (torch extraction, numpy TwoProduct)."""

    def minmax(self, a):
        return a.amax(-1, keepdim=True).numpy(), a.amin(-1, keepdim=True).numpy()

    def extract(self, a, k, square):
        tau, t, _ = eft.extract(a * a if square else a, k)
        return tau, t

    def dot(self, a, b, k):
        p, e = eft.two_prod(a.numpy(), b.numpy())
        tau, tr, _ = eft.extract(torch.from_numpy(p), k)
        return tau, tr, e.sum(-1, keepdims=True)


class NanBlind(TorchKernels):
    def minmax(self, a):
        return np.nanmax(a.numpy(), -1, keepdims=True), np.nanmin(a.numpy(), -1, keepdims=True)


class CoarseGrid(TorchKernels):  # sigma too small: the q_i no longer sum exactly
    def extract(self, a, k, square):
        return super().extract(a, k - 4 * (k > -1000), square)


class SloppyRemainder(TorchKernels):  # t off by far more than gamma_{n-1} sum |r|
    def extract(self, a, k, square):
        tau, t = super().extract(a, k, square)
        return tau, t + eft.pow2(k - 70)


class NoTwoProduct(TorchKernels):  # drops the products' rounding errors
    def dot(self, a, b, k):
        tau, tr, te = super().dot(a, b, k)
        return tau, tr, np.zeros_like(te)


@pytest.mark.parametrize("broken, message", [
    (NanBlind, "minmax"),
    (CoarseGrid, "tau is not the exact sum"),
    (SloppyRemainder, "tau + t is off the exact sum"),
    (NoTwoProduct, "tau + tr + te is off the exact dot"),
])
def test_self_test_rejects_broken_kernels(broken, message):
    assert native.self_test(TorchKernels()) is None
    failure = native.self_test(broken())
    assert failure is not None and message in failure


# ---------------------------------------------------------------------------
# the build


def test_build_is_reproducible_and_safe_to_race(monkeypatch, tmp_path):
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine")
    monkeypatch.setenv("NORMCERT_CACHE", str(tmp_path))
    with ThreadPoolExecutor(2) as pool:  # two builders at once under one folder
        (first, digest), (second, again) = pool.map(lambda _: native.build(), range(2))
    assert digest == again, "the build is not reproducible"
    assert list(tmp_path.iterdir()) == [], "a build must leave nothing behind for a later run to load"
    assert native.self_test(first) is None and native.self_test(second) is None


def test_a_library_replaced_between_its_build_and_its_load_is_refused(monkeypatch, tmp_path):
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine")
    monkeypatch.setenv("NORMCERT_CACHE", str(tmp_path))
    load = native.Kernels

    def raced(path):  # another process swaps the file as this one loads it
        kernels = load(path)
        (path.parent / "other.so").write_bytes(b"another library")
        os.replace(path.parent / "other.so", path)
        return kernels

    monkeypatch.setattr(native, "Kernels", raced)
    with pytest.raises(native.BuildError, match="native.so changed between its build and its load"):
        native.build()
    assert list(tmp_path.iterdir()) == []


def test_a_library_planted_in_the_cache_is_not_loaded(monkeypatch, tmp_path):
    """One run of a hostile kernel replaces every library a run left in NORMCERT_CACHE with one of its
    own (here: the real kernels plus a marker, so it passes the self-test); the next run loads
    what it built itself.  (The next run's cache is a copy at another path: this process has the
    first run's library loaded, and dlopen would hand back that one for the same file name.)"""
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine")
    forget_choice(monkeypatch, tmp_path)
    assert native.status().native
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "native.c").write_bytes(native.resources.files(native.__package__).joinpath(native.SOURCE).read_bytes()
                                       + b"\nint nc_planted = 1;\n")
    native._run([*native.compiler(), *native.FLAGS, "-o", "native.so", "native.c"], cwd=planted)
    later = shutil.copytree(tmp_path / "cache", tmp_path / "later")
    for so in later.rglob("*.so"):
        shutil.copy(planted / "native.so", so)
    monkeypatch.setenv("NORMCERT_CACHE", str(later))
    monkeypatch.setattr(native, "_chosen", [])  # a later run
    assert native.status().native and not hasattr(native.kernels().lib, "nc_planted")
