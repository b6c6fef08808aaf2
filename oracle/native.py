"""The optional native kernels (``native.c``): building, loading, self-testing, choosing the path.

The float64 backend's reductions need, per row and for sigma = 2**k,

    minmax    max_i a_i and min_i a_i (NaN if the row has one);
    extract   tau = sum_i q_i exactly and t = fl(sum_i (v_i - q_i)) in any order,
              q_i = fl(fl(sigma + v_i) - sigma), v_i = a_i or fl(a_i**2);
    dot       the same for p_i = fl(a_i b_i), plus te = fl(sum_i e_i) with
              p_i + e_i = a_i b_i exactly (Dekker's TwoProduct).

The pure path computes these with torch ops, several passes over memory
(``eft.extract``, ``eft.split_th``); ``native.c`` does each in one pass.  tau
is exact either way, and the certified reductions (``row_sum``, ``row_dot``,
``inv_rms``) are correctly rounded on both paths, so bit-identical.  t is not
(its summation order differs), and ``center`` uses the double-double tau + t
with an error bound rather than a correctly rounded sum: its low-order bits
can differ between the paths on rows of wide dynamic range, within the same
certified bound.

Which path runs: ``NORMCERT_ORACLE_NATIVE=0`` forces the pure path.  Otherwise
(unset, or 1) the native kernels run where they build, load and pass their
self-test; where any of that fails the pure path runs and one
``RuntimeWarning`` says why.  ``status()`` says which path is active and why;
``pure()`` forces the pure path inside a ``with`` block (the tests compare the
two paths in one process).

The build is reproducible: the flags are fixed (``FLAGS``).  No
``-march=native``: it makes machine-specific code, and the same source would
give different binaries on different machines.  The price, on x86-64 (baseline
SSE2 instead of AVX2; 2-core AMD EPYC, 64 x 4096 rows): extract and dot take
about 2.2x as long, minmax 1.5x, still 1.7x (extract) to 15x (dot) faster than
the torch path; a whole 64 x 1024 LayerNorm oracle call 13% longer (0.62 -> 0.70 ms).
``-ffp-contract=off`` and no ``-ffast-math`` are essential: an FMA contraction
or a reassociation breaks the error-free transformations (``(s + v) - s`` is
no longer the grid part of v, Dekker's e no longer exact).  ``native.c``
refuses to compile where binary64 expressions carry excess precision (x87).

Every process builds the library it loads (``build``: about 0.4 s of the
compiler once per process, an xdist worker being one); a run's process starts
it in a background thread before any kernel is imported
(``properties.run.warmup``), so that the compiler runs beside the rest of the
start.  A library found on
disk is never trusted by its name: a kernel under test runs as the same user
and could have replaced any file an earlier run left (with one that passes the
fixed self-test and is wrong elsewhere), and a later run, of another kernel,
would load it.  So the library is compiled into a fresh folder of an
unpredictable name (``tempfile.mkdtemp``, mode 0700) under ``NORMCERT_CACHE``
(default ``~/.cache/normcert``; a private folder in the temp dir when that
cannot be created), the sha256 of its bytes is taken as the compiler leaves
them and again after the load (a file replaced in between is refused), and the
folder is removed: nothing is left for a later run to find.  Not defended: a
process of the same user running at the same time can still replace the file
between the compiler and the first hash, and a kernel can change the compiler
on PATH, ``native.c`` or the rest of normcert's installed files, or, inside its
own run, normcert's memory.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from .eft import exps, pow2

ENV = "NORMCERT_ORACLE_NATIVE"
SOURCE = "native.c"
FLAGS = ("-O2", "-std=c99", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off", "-Wno-psabi")


class BuildError(Exception):
    """The native kernels could not be built: no compiler, or it failed (the message says how)."""


@dataclass(frozen=True)
class Status:
    native: bool  # True: the native kernels run; False: the pure torch path
    reason: str  # the library loaded, or why the pure path runs

    def __str__(self) -> str:
        return f"{'native' if self.native else 'pure'}: {self.reason}"


class Kernels:
    """ctypes front end of the kernels in ``native.c`` (rows along the last axis)."""

    def __init__(self, path):
        lib = ctypes.CDLL(str(path))
        p, i = ctypes.c_void_p, ctypes.c_longlong
        for name in ("nc_extract", "nc_extract_sq"):
            getattr(lib, name).argtypes = [p, i, i, i, i, p, p, p]
            getattr(lib, name).restype = None
        lib.nc_minmax.argtypes = [p, i, i, i, i, p, p]
        lib.nc_minmax.restype = None
        lib.nc_dot.argtypes = [p, i, i, p, i, i, i, i, p, p, p, p]
        lib.nc_dot.restype = None
        self.lib = lib

    @staticmethod
    def _rows(a: torch.Tensor) -> torch.Tensor:
        n = a.shape[-1]
        try:
            return a.view(-1, n)
        except RuntimeError:
            return a.reshape(-1, n)

    def minmax(self, a):
        a2 = self._rows(a)
        rows, n = a2.shape
        mx, mn = np.empty(rows), np.empty(rows)
        self.lib.nc_minmax(a2.data_ptr(), rows, n, a2.stride(0), a2.stride(1), mx.ctypes.data, mn.ctypes.data)
        shape = a.shape[:-1] + (1,)
        return mx.reshape(shape), mn.reshape(shape)

    def extract(self, a, k, square):
        a2 = self._rows(a)
        rows, n = a2.shape
        sig = np.ascontiguousarray(pow2(k).reshape(-1))
        tau, t = np.empty(rows), np.empty(rows)
        fn = self.lib.nc_extract_sq if square else self.lib.nc_extract
        fn(a2.data_ptr(), rows, n, a2.stride(0), a2.stride(1), sig.ctypes.data, tau.ctypes.data, t.ctypes.data)
        shape = a.shape[:-1] + (1,)
        return tau.reshape(shape), t.reshape(shape)

    def dot(self, a, b, k):
        a2, b2 = self._rows(a), self._rows(b)
        rows, n = a2.shape
        sig = np.ascontiguousarray(pow2(k).reshape(-1))
        tau, tr, te = np.empty(rows), np.empty(rows), np.empty(rows)
        self.lib.nc_dot(a2.data_ptr(), a2.stride(0), a2.stride(1), b2.data_ptr(), b2.stride(0), b2.stride(1),
                        rows, n, sig.ctypes.data, tau.ctypes.data, tr.ctypes.data, te.ctypes.data)
        shape = a.shape[:-1] + (1,)
        return tau.reshape(shape), tr.reshape(shape), te.reshape(shape)


# ---------------------------------------------------------------------------
# choosing the path

_lock = threading.Lock()
_chosen: list = []  # [] until first use, then [(Kernels or None, reason)]
_forced_pure = 0  # depth of active ``pure()`` blocks


def kernels() -> Kernels | None:
    """The native kernels, or None where the pure torch path runs (``status()`` says why)."""
    if _forced_pure:
        return None
    if not _chosen:
        with _lock:
            if not _chosen:
                _chosen.append(_choose())
    return _chosen[0][0]


def status() -> Status:
    """Which path the float64 oracle takes in this process, and why (builds the kernels if not done yet)."""
    if _forced_pure:
        return Status(False, "forced by normcert.oracle.native.pure()")
    lib = kernels()
    return Status(lib is not None, _chosen[0][1])


@contextmanager
def pure():
    """Inside this block the float64 oracle takes the pure torch path (process-wide)."""
    global _forced_pure
    _forced_pure += 1
    try:
        yield
    finally:
        _forced_pure -= 1


def _choose() -> tuple[Kernels | None, str]:
    setting = os.environ.get(ENV, "")
    if setting == "0":
        return None, f"{ENV}=0"
    if setting not in ("", "1"):
        raise ValueError(f"{ENV}={setting!r}: expected 0 (the pure torch path) or 1 (the native kernels "
                         f"where they build; the default)")
    try:
        lib, digest = build()
    except (BuildError, OSError, subprocess.SubprocessError) as e:
        reason = str(e) or type(e).__name__
    else:
        failure = self_test(lib)
        if failure is None:
            return lib, f"native kernels built by this process (sha256 {digest[:16]})"
        reason = f"the library built by this process failed its self-test: {failure}"
    warnings.warn(f"normcert oracle: the native kernels are unavailable ({reason}); the pure torch path runs "
                  f"instead (slower, same guarantees). Set {ENV}=0 to choose it and silence this warning.",
                  RuntimeWarning)
    return None, reason


# ---------------------------------------------------------------------------
# building


def compiler() -> list[str] | None:
    """The C compiler command: $CC (split like a shell would), else the first of cc, gcc, clang on PATH."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def build_root() -> Path:
    """Where each process's build folder goes: $NORMCERT_CACHE, else ~/.cache/normcert; where that
    cannot be created, a folder of this user's own in the temp dir (in a shared one another user
    could watch for the build and replace the library this process loads)."""
    home = Path(os.environ.get("NORMCERT_CACHE") or Path.home() / ".cache" / "normcert")
    try:
        home.mkdir(parents=True, exist_ok=True)
        return home
    except OSError:
        pass
    uid = os.getuid() if hasattr(os, "getuid") else None
    tmp = Path(tempfile.gettempdir()) / f"normcert-{uid if uid is not None else 'user'}"
    tmp.mkdir(mode=0o700, exist_ok=True)
    st = tmp.stat()
    if uid is not None and (st.st_uid != uid or st.st_mode & 0o022):
        raise BuildError(f"cannot create {home}, and {tmp} is not this user's private folder: set NORMCERT_CACHE")
    return tmp


def build() -> tuple[Kernels, str]:
    """The native kernels compiled by this process from the package's ``native.c`` (module
    docstring), and the sha256 of the library file they were loaded from.  BuildError where the
    compiler fails, or where the file changed between the build and the load."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler: CC is not set and none of cc, gcc, clang is on PATH")
    source = resources.files(__package__).joinpath(SOURCE).read_bytes()
    folder = Path(tempfile.mkdtemp(dir=build_root(), prefix="build-"))
    try:
        (folder / SOURCE).write_bytes(source)
        _run([*cc, *FLAGS, "-o", "native.so", SOURCE], cwd=folder)
        so = folder / "native.so"
        digest = hashlib.sha256(so.read_bytes()).hexdigest()
        lib = Kernels(so)
        if hashlib.sha256(so.read_bytes()).hexdigest() != digest:
            raise BuildError(f"{so} changed between its build and its load (another process wrote it)")
        return lib, digest
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(cmd: list[str], cwd) -> bytes:
    """stdout of cmd; a BuildError naming the command and its stderr if it fails."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=120)
    except FileNotFoundError:
        raise BuildError(f"compiler not found: {shlex.join(cmd[:1])}") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[:2000]
        raise BuildError(f"{shlex.join(cmd)} exited with status {done.returncode}" + (f": {err}" if err else ""))
    return done.stdout


# ---------------------------------------------------------------------------
# the self-test


def self_test(k) -> str | None:
    """None if ``k`` keeps the contract the certified reductions rely on, else what it broke.

    On fixed rows (wide dynamic range, complete cancellation, a tie, a NaN), in
    both layouts the kernels handle (rows contiguous; rows adjacent, the column
    sweep), checked against exact rational arithmetic, with n = 37, G =
    bit_length(n + 1), L = ceil(log2 n) and k per row as the backend picks it:

        minmax   bit-identical to numpy's row max and min
        extract  tau == sum_i q_i exactly, |tau + t - sum_i v_i| <= 2**(2L - 105 + k)
                 (v_i = a_i, and v_i = fl(a_i**2))
        dot      tau == sum_i q(fl(a_i b_i)) exactly,
                 |tau + tr + te - sum_i a_i b_i| <= 2**(2L - 104 + k)

    (the error bounds ``sums.sum_dd`` and ``Float64Exact.row_dot`` assume).
    """
    rng = np.random.default_rng(12345)
    a = rng.standard_normal((6, 37)) * 2.0 ** rng.integers(-30, 30, (6, 37))
    a[0, 1:] = -a[0, :-1]  # heavy cancellation
    a[1] = 1.0
    a[1, 0] = 2.0 ** -53  # a tie
    b = rng.standard_normal((6, 37))
    n = a.shape[1]
    G, L = (n + 1).bit_length(), (n - 1).bit_length()

    def off(parts, exact, k, slack):
        """Rows i where sum(parts[i]) is further than 2**(2L - slack + k_i) from exact[i]."""
        return [i for i, (p, e) in enumerate(zip(parts.tolist(), exact))
                if abs(sum(map(Fraction, p)) - e) > Fraction(2) ** int(2 * L - slack + k[i, 0])]

    for layout, x, y in (("contiguous rows", a, b), ("adjacent rows", np.asfortranarray(a), np.asfortranarray(b))):
        xn = x.copy(order="K")
        xn[2, 5] = np.nan
        mx, mn = k.minmax(torch.from_numpy(xn))
        if not (np.array_equal(mx[:, 0], xn.max(axis=1), equal_nan=True)
                and np.array_equal(mn[:, 0], xn.min(axis=1), equal_nan=True)):
            return f"minmax ({layout}) differs from numpy's row max / min"
        for square in (False, True):
            what = f"extract{' of squares' if square else ''} ({layout})"
            v = x * x if square else x
            kk = exps(np.abs(v).max(axis=1, keepdims=True)) + G
            tau, t = k.extract(torch.from_numpy(x), kk, square)
            if not np.array_equal(tau, ((pow2(kk) + v) - pow2(kk)).sum(axis=1, keepdims=True)):
                return f"{what}: tau is not the exact sum of the q_i"
            bad = off(np.hstack([tau, t]), [sum(map(Fraction, row)) for row in v.tolist()], kk, 105)
            if bad:
                return f"{what}: tau + t is off the exact sum in rows {bad}"
        kk = exps(np.abs(x).max(axis=1, keepdims=True)) + exps(np.abs(y).max(axis=1, keepdims=True)) + G
        tau, tr, te = k.dot(torch.from_numpy(x), torch.from_numpy(y), kk)
        if not np.array_equal(tau, ((pow2(kk) + x * y) - pow2(kk)).sum(axis=1, keepdims=True)):
            return f"dot ({layout}): tau is not the exact sum of the q_i"
        exact = [sum(Fraction(p) * Fraction(r) for p, r in zip(xi, yi)) for xi, yi in zip(x.tolist(), y.tolist())]
        bad = off(np.hstack([tau, tr, te]), exact, kk, 104)
        if bad:
            return f"dot ({layout}): tau + tr + te is off the exact dot product in rows {bad}"
    return None
