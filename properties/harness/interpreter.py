"""Where Triton's interpreter does not run what a GPU runs, and the corrections normcert installs.

On CPU normcert runs Triton kernels with ``TRITON_INTERPRET=1``.  The interpreter
executes a kernel's Python body on numpy arrays, and in places it cannot run
code that compiles and runs on a GPU.  A correct kernel would then be rejected
because of where it was checked, so each known gap has

* a probe: a tiny kernel that shows the gap on the installed Triton;
* a correction, installed only where the probe shows the gap, after which the
  probe runs as on a GPU (``test_interpreter.py`` pins both).

``install()`` runs the probes and installs what is needed; the certificate's
environment lists what was corrected.  The gaps (Triton 3.7.1):

``float scalars``
    A GPU passes a Python float argument as an fp32 scalar, so ``eps.to(tl.float32)``
    works on it (Liger-Kernel's RMSNorm does this).  The interpreter passes the
    float itself ("TODO: wrap everything in triton tensors") and the kernel dies
    with AttributeError.  Correction: floats are wrapped as fp32 scalars.
``libdevice``
    ``triton.language.extra.libdevice`` functions are stubs the GPU compiler
    resolves; the interpreter calls the stub, which returns None ("cannot convert
    None to tensor").  Correction: while a kernel is interpreted, its global names
    bound to a libdevice stub are bound to the ``tl.math`` namesake (rsqrt, exp,
    log, sqrt, erf, ...) or else to numpy's correctly rounded or faithful function
    of the same name (``NUMPY_LIBDEVICE``: tanh, log1p, expm1, pow, ...).  The
    ``fast_*`` approximations are left unbound on purpose: numpy would be more
    accurate than the GPU's, so such a kernel fails visibly on CPU rather than
    being certified for an accuracy it does not have.
``bfloat16``
    The interpreter keeps bf16 values as raw uint16 patterns and gets them wrong
    (upstream triton#8322): its fp32 → bf16 cast truncates (1.0059 → 1.0, a GPU
    gives 1.0078), its bf16 → fp32 cast of subnormals is wrong (1.01e-39 →
    4.41e-39), arithmetic, comparisons and reductions run on the patterns as
    integers, and a bf16 constant (``tl.full(..., 1.5, tl.bfloat16)``, ``x * 1.5``)
    raises.  The probe (``interpreter_probes.bfloat16_mismatches``) runs kernels
    over all 65,536 patterns and the fp32 rounding cases against exact
    references.  Correction: ``interpreter_bf16``, which computes bf16 as a GPU
    does (round to nearest even, exact subnormals, one rounding per operation).
``float8_e4m3fn``
    Its conversions to and from ``tl.float8e4nv`` are a generic bit shuffle: fp32 → e4m3fn
    rounds a tie up, carries into the exponent wrongly (31.0 → 16.0) and does not saturate
    (464 → NaN, +inf → 256); NaN widens to 480.  The probe
    (``interpreter_probes.float8_mismatches``) converts all 256 patterns and the rounding
    cases of every value.  Correction: ``interpreter_fp8`` (nearest even, saturating, as a
    GPU's ``cvt.rn.satfinite`` and torch's cast).
``int8``
    Its float → signed integer conversion is numpy's ``astype``, which wraps what is out of range
    (200.0 → -56, +inf → 0); a GPU's ``cvt.rzi`` truncates toward zero and *saturates* (200.0 →
    127, +inf → 127, -inf → -128) and gives 0 for NaN.  The probe (``interpreter_probes.int8_mismatches``)
    converts the rounding and range cases.  Correction: ``_correct_int8`` converts as a GPU does
    (a kernel that rounds with ``rint`` and clamps first, as normcert's do, never sees the difference;
    one that relies on the saturation would be wrongly rejected without it).

``tl.maximum with NaN``
    ``tl.maximum`` and ``tl.minimum`` by default (``propagate_nan=NONE``) are IEEE 754-2008 maxNum /
    minNum (PTX ``max.f32``): where one operand is NaN the result is the other.  The interpreter
    computes both forms with numpy's ``maximum`` / ``minimum``, which keep the NaN, so a kernel whose
    scale is ``tl.maximum(amax / q, floor)`` gets NaN on CPU and the floor on a GPU (a ``nan=ignore``
    kernel would be rejected on CPU only).  ``tl.max`` / ``tl.min`` need nothing: the interpreter
    reduces them with ``np.nanmax`` / ``np.nanmin``, as a GPU.  The probe
    (``interpreter_probes.maxnum_mismatches``) takes both forms on NaN pairs.  Correction:
    ``_correct_maxnum`` computes the default form with numpy's ``fmax`` / ``fmin`` (maxNum /
    minNum); ``propagate_nan=ALL`` keeps ``maximum`` / ``minimum``.

``fp4 stores`` (no gap on Triton 3.7.1)
    normcert's FP4 kernels (``triton_fp4``) store E2M1 codes formed by float32 comparisons and a
    sign bit read through a bitcast, packed as int32 and stored to uint8, and UE8M0 scales rounded
    up on their float32 bits (integer min / max / add / and / shift) and stored as the exponent
    byte; their E4M3 scales go through the ``float8_e4m3fn`` correction.  The probe
    (``interpreter_probes.fp4_mismatches``) runs those helpers on the E2M1 ties, 1 ulp either side,
    every float32 power of two, the subnormals and NaN: the bare interpreter stores what a GPU does
    (numpy's bit views, integer arithmetic and in-range int32 -> uint8 casts are exact), so there
    is no correction; the probe stays so that a Triton whose interpreter changes this is listed as
    "fp4 stores (not corrected)" instead of certifying on wrong bytes.

Besides the gaps, one change of cost and none of semantics, made by ``install()`` whenever the
interpreter is active (``_bind_language_once``): the interpreter binds ``triton.language``'s
builtins to its own (``_patch_lang``: ``inspect.getmembers`` over four namespaces) at every launch
*and again at every call of a ``@triton.jit`` helper* inside the kernel, and undoes the launch's
binding at its end.  normcert binds each language module once for the process, at the first launch
or helper call that sees it, and leaves it bound (under the interpreter no launch runs the
unbound language); a kernel's own globals (the libdevice names) are still bound per launch and
undone at its end.  And ``_get_np_dtype``'s answers are kept, not rebuilt at each call
(``_np_dtypes_once``), as are the block types and tensor shapes Triton's semantic layer builds at
each operation (``interpreter_types``).  Outputs are bitwise the same (``test_interpreter``); a call of a registry
Triton kernel is 1.2 to 1.6 times as fast as with Triton's binding at every call, and a launch in
one thread no longer undoes the binding under a launch running in another
(``benchmarks/interpreter.py``).
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import threading

import numpy as np


def active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def imported() -> bool:
    """Can a Triton kernel run interpreted in this process: the interpreter is active and triton is
    imported (by a kernel's module, the registry, or a kernel's first call)?  Until then normcert
    imports no triton and runs no probe (about a second that a run of eager kernels does without)."""
    return active() and "triton" in sys.modules


def install() -> list[str]:
    """Probe the interpreter and correct each gap it shows: "name" for each correction made and
    verified by its probe, "name (not corrected)" where the probe still fails after it."""
    if not active():
        return []
    try:
        from . import interpreter_probes as probes  # noqa: PLC0415 - imports triton
    except ImportError:
        return []
    from . import interpreter_bf16, interpreter_fp8, interpreter_types, launches  # noqa: PLC0415

    with launches.paused():  # the probe kernels are normcert's, no kernel's launches
        made = _corrected(probes, interpreter_bf16, interpreter_fp8)
    _bind_language_once()
    _np_dtypes_once()
    interpreter_types.install()
    return made


def _corrected(probes, interpreter_bf16, interpreter_fp8) -> list[str]:
    """``install``'s probes and corrections: the names of the corrections made (``install``)."""
    made = []
    for name, probe, correct in (("float scalars", probes.float_probe, _correct_floats),
                                 ("libdevice", probes.libdevice_probe, _correct_libdevice),
                                 ("bfloat16", probes.bfloat16_probe, interpreter_bf16.install),
                                 ("float8_e4m3fn", probes.float8_probe, interpreter_fp8.install),
                                 ("int8", probes.int8_probe, _correct_int8),
                                 ("tl.maximum with NaN", probes.maxnum_probe, _correct_maxnum),
                                 ("fp4 stores", probes.fp4_probe, None)):
        if not _runs(probe):
            if correct is not None:
                correct()
            made.append(name if _runs(probe) else f"{name} (not corrected)")
    return made


def launches() -> int:
    """Kernel launches Triton's interpreter has run in this process (0 when it is not active or
    Triton is not installed).  Counted around one call, it tells a kernel that runs under the
    interpreter -- a Python loop over its grid, orders of magnitude slower than a GPU -- from one
    that does not.  The count starts at the first call, whether or not ``install()`` ran (0 while triton
    is not imported: nothing has launched)."""
    if not imported():
        return 0
    try:
        from triton.runtime.interpreter import GridExecutor  # noqa: PLC0415
    except ImportError:
        return 0
    if not hasattr(GridExecutor, "normcert_launches"):
        call = GridExecutor.__call__

        def counted(self, *args, **kwargs):
            GridExecutor.normcert_launches += 1
            return call(self, *args, **kwargs)

        GridExecutor.normcert_launches = 0
        GridExecutor.__call__ = counted
    return GridExecutor.normcert_launches


def programs(thread: int) -> int:
    """Programs Triton's interpreter has started in the thread whose ident is ``thread`` (0 when
    it is not active or Triton is not installed).  The interpreter runs a launch's grid as a Python
    loop, one program after the other, so a call whose count still rises is advancing, however
    slowly: the watchdog tells a slow call from a hung one by it (``properties.harness.sandbox.Worker``).
    The count starts at the first call, whether or not ``install()`` ran (0 while triton is not imported)."""
    if not imported():
        return 0
    try:
        from triton.runtime.interpreter import InterpreterBuilder  # noqa: PLC0415
    except ImportError:
        return 0
    if not hasattr(InterpreterBuilder, "normcert_programs"):
        start = InterpreterBuilder.set_grid_idx  # called once per program, as it begins
        counts = InterpreterBuilder.normcert_programs = {}

        def counted(self, x, y, z):
            ident = threading.get_ident()
            counts[ident] = counts.get(ident, 0) + 1
            return start(self, x, y, z)

        InterpreterBuilder.set_grid_idx = counted
    return InterpreterBuilder.normcert_programs.get(thread, 0)


def programs_so_far(thread: int) -> int:
    """``programs(thread)`` as counted so far, read without importing or patching anything (0 until
    ``programs`` has installed the count): safe from a thread that runs beside an import of triton,
    where importing a part of it could hand the importing thread a half-made module."""
    builder = getattr(sys.modules.get("triton.runtime.interpreter"), "InterpreterBuilder", None)
    return getattr(builder, "normcert_programs", {}).get(thread, 0)


def _runs(probe) -> bool:
    try:
        return probe()
    except Exception:  # noqa: BLE001 - the gap shows as any error from the interpreter
        return False


def _correct_floats() -> None:
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    convert = interpreter._implicit_cvt

    def implicit_cvt(arg):
        if isinstance(arg, float):  # what the GPU launcher does: an fp32 scalar
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return convert(arg)

    interpreter._implicit_cvt = implicit_cvt


def _correct_int8() -> None:
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    from .interpreter_bf16 import widen  # noqa: PLC0415

    builder = interpreter.InterpreterBuilder
    cast = builder.create_fp_to_si

    def create_fp_to_si(self, src, dst_type):
        s = src.dtype.scalar
        if s not in (tl.float16, tl.bfloat16, tl.float32, tl.float64):
            return cast(self, src, dst_type)
        target = interpreter._get_np_dtype(dst_type)
        info = np.iinfo(target)
        value = widen(src.data) if s == tl.bfloat16 else src.data.astype(np.float64)
        with np.errstate(invalid="ignore"):
            ints = np.where(np.isnan(value), 0, np.clip(np.trunc(value), info.min, info.max))
        return interpreter.TensorHandle(ints.astype(target), dst_type.scalar)

    builder.create_fp_to_si = create_fp_to_si


def _correct_maxnum() -> None:
    """tl.maximum / tl.minimum's default form (maxnumf / minnumf) as maxNum / minNum: np.fmax / np.fmin
    drop a NaN operand, as a GPU's max.f32 does (through ``binary_op``, so bfloat16's correction
    still rounds as a GPU)."""
    from triton.runtime import interpreter  # noqa: PLC0415

    builder = interpreter.InterpreterBuilder
    builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)


class _Globals:
    """A function's globals as attributes, so the interpreter's patch scope can set and restore them."""

    def __init__(self, namespace: dict):
        object.__setattr__(self, "_ns", namespace)

    def __getattr__(self, name):
        try:
            return self._ns[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._ns[name] = value

    def __delattr__(self, name):
        del self._ns[name]


def _libdevice_stubs() -> set:
    stubs = set()
    for module in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        stubs.update(f for _, f in inspect.getmembers(mod, inspect.isfunction))
    return stubs


NUMPY_LIBDEVICE = {
    "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "log10": np.log10,
    "log1p": np.log1p, "expm1": np.expm1, "cbrt": np.cbrt, "pow": np.power, "atan2": np.arctan2,
    "hypot": np.hypot, "copysign": np.copysign, "fmod": np.fmod, "trunc": np.trunc, "rint": np.rint,
    "nearbyint": np.rint,
}


def _numpy_elementwise(fn):
    """A libdevice function for the interpreter: fn on the operands' arrays, in the first tensor's format."""
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    def call(*args, **_):
        first = next(a for a in args if isinstance(a, tl.tensor))
        with np.errstate(all="ignore"):
            out = fn(*(a.handle.data if isinstance(a, tl.tensor) else a for a in args))
        data = np.asarray(out).astype(first.handle.data.dtype)
        return tl.tensor(interpreter.TensorHandle(data, first.dtype.scalar), first.type)

    return call


def _correct_libdevice() -> None:
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    stubs = {id(f) for f in _libdevice_stubs()}
    shims = {name: _numpy_elementwise(fn) for name, fn in NUMPY_LIBDEVICE.items()}
    patch_lang = interpreter._patch_lang

    def patched(fn):
        scope = patch_lang(fn)  # tl.math is now the interpreter's
        _bind_libdevice(fn, scope)
        return scope

    def _bind_libdevice(fn, scope):
        names = _Globals(fn.__globals__)
        for name, value in list(fn.__globals__.items()):
            if id(value) not in stubs:
                continue
            if hasattr(tl.math, value.__name__):
                scope.set_attr(names, name, getattr(tl.math, value.__name__))
            elif value.__name__ in shims:
                scope.set_attr(names, name, shims[value.__name__])

    patched.normcert_bind = _bind_libdevice
    patched.normcert_language = patch_lang  # the language's binding alone, without the libdevice names
    interpreter._patch_lang = patched


def _np_dtypes_once() -> None:
    """The interpreter's ``_get_np_dtype`` (a Triton type to the numpy type that holds it, called at
    every cast and store of every program) builds its table of twenty numpy types at each call, a
    tenth of a program's time: each answer is now kept, keyed by the element type, the same answers."""
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    build = interpreter._get_np_dtype
    if getattr(build, "normcert_kept", None) is not None:
        return
    kept: dict = {}

    def np_dtype(tt_dtype):
        element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        try:
            return kept[element]
        except KeyError:
            kept[element] = build(element)
            return kept[element]
        except TypeError:  # an element type that cannot be a key
            return build(element)

    np_dtype.normcert_kept = kept
    np_dtype.normcert_built = build
    interpreter._get_np_dtype = np_dtype


def _language_modules(fn) -> frozenset:
    """The ``triton.language`` modules ``fn``'s globals hold (those ``_patch_lang`` binds)."""
    import triton.language as tl  # noqa: PLC0415

    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def _bind_language_once() -> None:
    """Bind ``triton.language`` once for the process: the first launch (or helper call) that sees a
    language module (``triton.language``, ``triton.language.core``) binds it, and it stays bound;
    a kernel's own globals (the libdevice names, where that correction is installed) are still
    bound at each launch and helper call, in the launch's scope, and the launch's end undoes them.
    (Triton binds the language at every launch and again at each helper call, inspecting four
    namespaces each time, and undoes the launch's binding at its end: a tenth of an interpreted
    certify run, and a launch in one thread undid the binding of a launch running in another.)"""
    from triton.runtime import interpreter  # noqa: PLC0415

    if getattr(interpreter._patch_lang, "normcert_bound_once", False):
        return
    patch_lang = interpreter._patch_lang
    bind = getattr(patch_lang, "normcert_bind", None)
    language = getattr(patch_lang, "normcert_language", patch_lang)
    bound: set = set()  # the ids of the language modules bound for the process
    lock = threading.Lock()
    running = threading.local()  # per thread: the running launch's scope (a launch never starts inside another)

    def patched(fn):
        modules = _language_modules(fn)
        with lock:
            if not modules <= bound:
                language(fn)  # its scope dropped: never undone
                bound.update(modules)
        launch = getattr(running, "launch", None)
        scope = launch if launch is not None else interpreter._LangPatchScope()
        if bind is not None:
            bind(fn, scope)
        if launch is not None:
            return interpreter._LangPatchScope()  # a helper call's: nothing of its own to undo
        running.launch = scope
        restore = scope.restore

        def restore_and_end():
            running.launch = None
            restore()

        scope.restore = restore_and_end
        return scope

    patched.normcert_bound_once = True
    patched.normcert_every_call = patch_lang  # Triton's binding at every call, with the corrections (benchmarks)
    interpreter._patch_lang = patched
