"""Autotuned Triton kernels, run under each of their configs instead of a timing's choice.

A GPU's autotuner (``@triton.autotune``) times its configs on the first call of each key and
runs the fastest; which one that is depends on the GPU model, the shapes and noise.  A kernel is
correct only if every config it may pick is correct, so normcert never lets timing choose: it
*forces* each config in turn (on CPU, where the interpreter has no driver to time with, and on a
GPU alike).

``tuners(kernel)``
    The autotuners the kernel under test can reach: ``triton.autotune`` objects bound to a global
    name of the kernel's function, or to an attribute it names of a module a global names
    (``lib.kernel_fwd[grid](...)``, ``pkg.ops.kernel_fwd``), or those of the functions, methods
    and ``torch.autograd.Function`` classes so named, followed through wrappers (``__wrapped__``,
    ``functools.partial``, ``@triton.heuristics``'s ``.fn``) to a bounded depth, never into torch,
    Triton or numpy.  No other autotuner (another library's) is touched; one reached otherwise (a
    name built at run time) is not found, and where its benchmarking fails the kernel's failure
    says so (``properties.harness.sandbox``).

A config is recorded by its content, not its index (config lists are built at import time and
differ by platform): its kwargs, and where it runs compiled also ``num_warps``, ``num_stages``,
``num_ctas`` and ``maxnreg``.  Triton's interpreter ignores those four, so configs that differ
only in them are one computation on CPU and are checked once (``distinct``); a CPU run never
claims a ``num_warps``.

``plan(tuners, interpreted)``
    The choices to run under: choice j forces, on every tuner, its distinct config number
    j mod (its count), so there are as many choices as the largest tuner has distinct configs
    and every config of every tuner is in one.  (Configs of different tuners are not crossed:
    a forward and a backward kernel are checked config by config, not pair by pair.)

``Forcing(tuners)``, ``with forcing.under(choice): ...``
    While it holds, each tuner's ``run`` is its forced config's, reproducing what a GPU's
    autotuner does around the config it picked and nothing else:

    * the key is Triton's (the ``key`` arguments, then every tensor argument's dtype), and
      ``prune_configs_by`` (``early_config_prune``, ``perf_model`` / ``top_k``) prunes as it does:
      a forced config pruned away for this call's key is one the GPU could not pick, and the
      call runs the pruned list's config number j mod its length instead;
    * on the first call of a key (per tuner and choice: the autotuner's own cache, which lives per
      process and per xdist worker, is bypassed) the tuner's pre-hook runs with ``reset_only``
      (``reset_to_zero``'s zeroing, as Triton does after benchmarking), then on every call the
      config's own ``pre_hook``; ``restore_value`` and ``post_hook`` only ever wrap benchmarking,
      which never happens;
    * ``@triton.heuristics`` values are computed by Triton itself, as on a GPU.

    ``forcing.last`` is the config the latest call ran (the pruned list's, where the forced one
    was pruned away for that call's key); ``forcing.pruned`` says (forced, ran) for the latest
    call since the last ``select`` whose forced config was pruned away, so that a failure can
    name the config that really ran.
"""
from __future__ import annotations

import functools
import inspect
import sys
import types
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

COMPILED_ONLY = ("num_warps", "num_stages", "num_ctas", "maxnreg")  # ignored by the interpreter
FOREIGN = ("torch", "triton", "numpy", "builtins", "typing", "functools", "collections", "math", "os", "sys")
DEPTH = 6  # how many calls away from the kernel an autotuner is looked for


def _autotuner_type():
    from triton.runtime.autotuner import Autotuner  # noqa: PLC0415 - Triton is optional until a kernel uses it
    return Autotuner


def _unwrap(obj, depth=8):
    """``obj`` followed through Triton's ``Heuristics`` (``.fn``) to an autotuner, or None."""
    autotuner = _autotuner_type()
    for _ in range(depth):
        if isinstance(obj, autotuner):
            return obj
        if type(obj).__name__ != "Heuristics" or not hasattr(obj, "fn"):
            return None
        obj = obj.fn
    return None


def _foreign(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in FOREIGN


def _functions(obj):
    """The Python functions ``obj`` stands for: itself, what it wraps, a class's methods (a bound
    method of a foreign class's, e.g. an ``autograd.Function``'s ``apply``: its own class's)."""
    if isinstance(obj, functools.partial):
        obj = obj.func
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, types.MethodType):
        owner = obj.__self__ if isinstance(obj.__self__, type) else type(obj.__self__)
        if _foreign(obj.__func__) and not _foreign(owner):  # ``MyFunction.apply``: torch's apply, my class
            return _functions(owner)
        obj = obj.__func__
    if isinstance(obj, types.FunctionType):
        return [obj]
    if isinstance(obj, type) and not _foreign(obj):
        return [f for v in vars(obj).values() for f in _functions(v)]
    call = getattr(type(obj), "__call__", None)
    if callable(obj) and isinstance(call, types.FunctionType) and not _foreign(type(obj)):
        return [call]
    return []


def tuners(kernel) -> tuple:
    """The autotuners ``kernel`` reaches (see the module docstring), in the order found; none where
    Triton was never imported (no kernel of this process can be a Triton one)."""
    if "triton" not in sys.modules:
        return ()
    found, seen = [], set()
    frontier = _functions(kernel)
    for _ in range(DEPTH):
        following = []
        for fn in frontier:
            if id(fn) in seen or _foreign(fn):
                continue
            seen.add(id(fn))
            names = set(fn.__code__.co_names) | {n for c in fn.__code__.co_consts if isinstance(c, types.CodeType)
                                                  for n in c.co_names}
            cells = [c.cell_contents for c in fn.__closure__ or () if _has_contents(c)]
            for value in _attributes([fn.__globals__[n] for n in names if n in fn.__globals__] + cells, names):
                tuner = _unwrap(value)
                if tuner is not None:
                    if all(tuner is not t for t in found):
                        found.append(tuner)
                else:
                    following.extend(_functions(value))
        frontier = following
    return tuple(found)


def _attributes(values: list, names: set) -> list:
    """``values`` with each module among them (not a foreign one) replaced by its attributes that
    ``names`` name, and so on down a package: a function's ``co_names`` hold ``lib`` and ``kernel_fwd``
    for ``lib.kernel_fwd[grid](...)``, the usual package layout, and ``pkg``, ``ops``, ``kernel_fwd``
    for ``pkg.ops.kernel_fwd``.  (A name that only happens to match follows one attribute too many,
    never one too few.)"""
    out, modules, seen = [], [], set()
    for value in values:
        (modules if isinstance(value, types.ModuleType) else out).append(value)
    while modules:
        module = modules.pop()
        if id(module) in seen or module.__name__.split(".")[0] in FOREIGN:
            continue
        seen.add(id(module))
        for n in names:
            value = vars(module).get(n)
            if value is not None:
                (modules if isinstance(value, types.ModuleType) else out).append(value)
    return out


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


@dataclass(frozen=True)
class Config:
    """One config by content: its kwargs and, where compiled, its compiled-only settings."""

    kwargs: tuple
    compiled: tuple = ()
    pre_hook: object = None

    def describe(self) -> str:
        hook = ", pre_hook" if self.pre_hook is not None else ""
        return ", ".join(f"{k}={v}" for k, v in self.kwargs + self.compiled) + hook or "(no kwargs)"


def content(config, interpreted: bool) -> Config:
    """A ``triton.Config`` as normcert records it: on CPU its compiled-only settings dropped."""
    compiled = () if interpreted else tuple((k, getattr(config, k)) for k in COMPILED_ONLY
                                            if getattr(config, k, None) is not None)
    return Config(tuple(sorted(config.kwargs.items())), compiled, config.pre_hook)


def distinct(tuner, interpreted: bool) -> tuple:
    """The tuner's configs that are different computations here, first of each, in list order."""
    out, seen = [], []
    for config in tuner.configs:
        c = content(config, interpreted)
        if c not in seen:
            seen.append(c)
            out.append(config)
    return tuple(out)


def plan(found: tuple, interpreted: bool) -> tuple[tuple[int, ...], ...]:
    """Choice j is the tuple (j mod len(distinct(t))) over the tuners t; () without tuners."""
    counts = [len(distinct(t, interpreted)) for t in found]
    return tuple(tuple(j % c for c in counts) for j in range(max(counts, default=0)))


def key_of(tuner, args: tuple, kwargs: dict) -> tuple:
    """Triton's autotuning key: the ``key`` arguments' values, then every tensor argument's dtype."""
    named = {k: v for k, v in {**dict(zip(tuner.arg_names, args)), **kwargs}.items() if k in tuner.arg_names}
    return tuple([named[k] for k in tuner.keys if k in named] +
                 [str(v.dtype) for v in named.values() if hasattr(v, "dtype")])


class Forcing:
    """Runs a kernel's tuners under chosen configs (see the module docstring).  One per kernel and run:
    it remembers which keys each (tuner, choice) has seen, as the autotuner's cache would."""

    def __init__(self, found: tuple, interpreted: bool):
        self.tuners = found
        self.interpreted = interpreted
        self.configs = tuple(distinct(t, interpreted) for t in found)
        self.choices = plan(found, interpreted)
        self.names = tuple(self.describe(j) for j in range(len(self.choices)))  # each choice by content
        self._keys: set = set()
        self.last: Config | None = None  # the config the latest forced call ran
        self.pruned: tuple[str, str] | None = None  # (forced, ran) where pruning replaced the forced config
        self.selected = 0

    def select(self, name: str) -> None:
        """Make the choice named ``name`` (``names``; "": the first) the one ``active`` forces."""
        if name and name not in self.names:
            raise ValueError(f"config {name!r} is not one of the kernel's: {'; '.join(self.names) or 'it has none'}")
        self.selected = self.names.index(name) if name else 0
        self.pruned = None

    def pruned_note(self) -> str:
        """What a failure's message adds where the selected config was pruned away for the latest
        call's key: the config that ran in its place ("" where none was)."""
        if self.pruned is None:
            return ""
        forced, ran = self.pruned
        return f" (config {forced} is pruned away for this call's key: it ran {ran}, as a GPU would)"

    def active(self):
        """``under`` the selected choice, for a kernel with autotuners (else nothing to force)."""
        return self.under(self.selected) if self.choices else nullcontext()

    def describe(self, number: int) -> str:
        """Choice ``number``'s configs, one per tuner (named by its kernel when there are several)."""
        parts = [content(self.configs[t][i], self.interpreted).describe() for t, i in enumerate(self.choices[number])]
        if len(parts) == 1:
            return parts[0]
        return "; ".join(f"{_name(t)}: {p}" for t, p in zip(self.tuners, parts))

    @contextmanager
    def under(self, number: int):
        """While it holds, every tuner runs choice ``number``'s config."""
        choice = self.choices[number]
        for k, (t, i) in enumerate(zip(self.tuners, choice)):
            t.run = functools.partial(self._run, t, self.configs[k][i], number)
        try:
            yield
        finally:
            for t in self.tuners:
                vars(t).pop("run", None)

    def _run(self, tuner, forced, number, *args, **kwargs):
        tuner.nargs = dict(zip(tuner.arg_names, args))
        try:
            allowed = tuner.prune_configs(kwargs)
            mine = content(forced, self.interpreted)
            config = next((c for c in allowed if content(c, self.interpreted) == mine), None)
            if config is None:  # pruned away for this key: the GPU could not pick it here
                config = allowed[number % len(allowed)]
                self.pruned = (mine.describe(), content(config, self.interpreted).describe())
            full = {**tuner.nargs, **kwargs, **config.all_kwargs()}
            key = (id(tuner), number, key_of(tuner, args, kwargs))
            if key not in self._keys and len(tuner.configs) > 1:  # Triton tunes (and resets) only then
                self._keys.add(key)
                tuner.pre_hook(full, reset_only=True)
            if config.pre_hook is not None:
                config.pre_hook(full)
            self.last = content(config, self.interpreted)
            return tuner.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            tuner.nargs = None


def _name(tuner) -> str:
    return getattr(tuner.base_fn, "__name__", "kernel")
