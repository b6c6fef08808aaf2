"""The registry of implementations under test: one record per implementation.

Sources, in order:
  * this package's modules (``MODULES``), each exposing ``IMPLS``;
  * installed packages, through the ``normcert.impls`` entry-point group: each
    entry point names a callable returning an iterable of ``Impl``;
  * ``--impl OP=MODULE:ATTR`` on the pytest command line (``plugin``).

The kernel contract (signatures, dtypes, what "not supported" means) is in the
README; the meaning of each op is ``oracle``'s.
"""
from __future__ import annotations

import importlib
import os
import sys
import threading
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Callable

import torch

from ..oracle import OPS

from ..properties.declared import conventions, modules, signature
from ..properties.declared.domain import Domain, DomainError, check_op, parse, without

BACKENDS = ("eager", "compiled", "custom-op", "triton", "case-study", "plugin")
MODULES = tuple(f"normcert.impls.{m}" for m in ("eager", "compiled", "custom_op", "triton_norms", "triton_gated_norm",
                                                 "triton_dynamic_quant", "triton_group_quant", "triton_swiglu",
                                                 "triton_swiglu_quant", "triton_fp4",
                                                 "triton_geglu",
                                                 "case_studies"))


@dataclass(frozen=True)
class Impl:
    op: str
    name: str
    backend: str
    fn: Callable = field(compare=False)
    target: str  # "module:attr", importable: how a replay file finds it again
    domain: Domain = Domain()  # what it supports (``domain``): cases outside it are not drawn
    devices: tuple[str, ...] = ("cpu", "cuda")
    backward: bool | None = True  # None: not declared (a plug-in): its outputs say (runner.backward_gate)
    expected_failure: str = ""  # case studies: why the suite must reject it
    convention: str = ""  # "", or how it writes its outputs (``conventions``); fn is then the adapted callable
    agrees_with: "Impl | None" = field(default=None, compare=False)  # must give its bits (``--agree``)
    import_fault: str = ""  # what importing its module did to the process (``imported``): every call of it fails
    kernel: Callable | None = field(default=None, compare=False)  # fn before its convention's adapter (``make``)
    compiles: bool = False  # served compiled: a torch custom op, or --compile (``properties.families.compiled``)
    narrowed: tuple[str, ...] = ()  # options the registry declared unsupported from the signature, not the author

    def __post_init__(self):
        """The domain is read again as normcert's own (``domain.parse`` of its fields), whoever built
        the record (an entry point may build one directly; ``dataclasses.replace``, as ``--domain``
        does, passes here too), narrowed to the op's options the kernel's signature takes
        (``signature.lacking``: the others declared ``unsupported``, whatever the declaration
        said), and it is a domain the op can be checked on (``domain.check_op``: a row fits, its
        largest fitted case is not too large, its options, flags and choices are the op's).  The
        options so added that the author did not declare are ``narrowed``: registration's, not the
        author's (``declares``)."""
        where = f"{self.name!r}: domain"
        if type(self.domain) is not Domain:
            raise UsageError(f"{where}: a {type(self.domain).__name__} object is not accepted (normcert reads a "
                             f"domain only from its own text): give a string of KEY=VALUE items or a dict")
        try:
            domain = parse(self.domain.spec(), where)
            kernel = self.fn if self.kernel is None else self.kernel
            lacks = signature.lacking(OPS[self.op], kernel)
            added = tuple(n for n in lacks if n in self.narrowed or n not in (domain.unsupported or ()))
            object.__setattr__(self, "domain", without(domain, lacks))
            object.__setattr__(self, "narrowed", added)
            check_op(self.domain, OPS[self.op], where)
        except DomainError as e:
            raise UsageError(str(e)) from None

    @property
    def id(self) -> str:
        return f"{self.op}:{self.name}"

    @property
    def declares(self) -> bool:
        """Did the kernel's author declare a domain (``normcert_domain``, ``--domain``, a registry
        entry's)?  The options registration declared unsupported (``narrowed``) are no declaration of
        the author's: a kernel written before an option existed may still refuse a dtype with
        NotImplementedError, as the contract allows a kernel that declares nothing."""
        unsupported = tuple(n for n in self.domain.unsupported or () if n not in self.narrowed)
        return replace(self.domain, unsupported=unsupported or None).declared


class UsageError(ValueError):
    """A bad --impl or registry entry; the message is one line for the user."""


def with_domain(impl: Impl, domain: Domain, where: str, **changes) -> Impl:
    """``impl`` with ``domain`` as its declared domain (and ``changes``); UsageError, one line naming
    ``where`` (``--domain``), where its op cannot be checked on it (``domain.check_op``)."""
    try:
        check_op(domain, OPS[impl.op], where)
    except DomainError as e:
        raise UsageError(str(e)) from None
    return replace(impl, domain=domain, **changes)


def make(op, name, backend, fn, **kw) -> Impl:
    """An Impl whose target is the function's own module and name; with ``convention=``, ``fn``
    is the kernel as it is called (``conventions``) and the record holds it adapted to the contract."""
    if op not in OPS:
        raise UsageError(f"unknown op {op!r} for {name!r}: expected one of {', '.join(OPS)}")
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r} for {name!r}: expected one of {', '.join(BACKENDS)}")
    target = kw.pop("target", None) or f"{fn.__module__}:{fn.__name__}"
    try:  # declared with the registry entry, else on the kernel itself
        where = f"{name!r}: normcert_domain" if "domain" not in kw else f"{name!r}: domain"
        kw["domain"] = parse(kw.get("domain") or getattr(fn, "normcert_domain", None), where=where)
        check_op(kw["domain"], OPS[op], where)  # here, where its source is known; the record checks it again
    except DomainError as e:
        raise UsageError(str(e)) from None
    if not OPS[op].grads:
        kw["backward"] = False  # an inference-only op: no backward to have
    convention = kw.get("convention", "")
    try:
        conventions.check(convention, OPS[op])
    except ValueError as e:
        raise UsageError(f"{name!r}: {e}") from None
    kw["compiles"] = kw.get("compiles") or is_custom_op(fn)
    return Impl(op, name, backend, conventions.adapt(convention, OPS[op], fn), target, kernel=fn, **kw)


def is_custom_op(fn) -> bool:
    """Is ``fn`` a torch operator: one made with ``torch.library.custom_op``, or reached as
    ``torch.ops.NAMESPACE.NAME`` (an overload packet) or ``....default`` (an overload)?  Such a
    kernel is one a compiled model calls, and is checked so (``properties.families.compiled``)."""
    return isinstance(fn, (torch.library.CustomOpDef, torch._ops.OpOverload, torch._ops.OpOverloadPacket))


FLUSHED_AT_IMPORT = "set flush-to-zero at import (torch.set_flush_denormal(True))"
_import_faults: dict[str, str] = {}  # module name -> what importing it did to this process (``imported``)
_importers: dict[str, int] = {}  # module name -> the ident of the thread that imported it (``imported``)


def flushes_denormals() -> bool:
    """Does this thread flush subnormals to zero (``torch.set_flush_denormal``: the CPU's FTZ / DAZ
    bits, per thread; a thread starts with its creator's)?"""
    return torch.tensor([2.0 ** -1070], dtype=torch.float64).mul(1.0).item() == 0.0


def imported(load, module: str):
    """``load()`` (importing ``module``, or an entry point's loading and call), run so that this
    thread -- the one normcert's oracle and error model compute in -- keeps IEEE subnormals
    whatever the code run did: flush-to-zero found on afterwards is turned off again.  Where the
    load turned it on, ``module`` and every module the load imported carry the fault
    (``import_fault``), and so do the kernels from them: a kernel module that sets a process-wide
    speed setting at import changes the oracle's arithmetic, not only its own.  The thread that
    ran the load is noted as the importer of every module it imported (``importer``)."""
    before, loaded = flushes_denormals(), set(sys.modules)
    try:
        return load()
    finally:
        _importers.update(dict.fromkeys(set(sys.modules) - loaded, threading.get_ident()))
        if flushes_denormals():
            torch.set_flush_denormal(False)
            if not before:
                _import_faults.update(dict.fromkeys((set(sys.modules) - loaded) | {module}, FLUSHED_AT_IMPORT))


def import_fault(module: str) -> str:
    """What importing ``module``, or a package above it, did to the process (``imported``); "" for nothing."""
    parts = module.split(".")
    return next((_import_faults[m] for m in (".".join(parts[:i]) for i in range(len(parts), 0, -1))
                 if m in _import_faults), "")


def importer(impl: Impl) -> int:
    """The ident of the thread that imported ``impl``'s module (or the package above it) in this process:
    the one that ran ``imported``, else the main thread (a module imported by an ``import`` statement
    of the program itself, as the registry's own and a test's are, is imported there)."""
    parts = impl.target.partition(":")[0].split(".")
    return next((_importers[m] for m in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if m in _importers),
                threading.main_thread().ident)


def _faulted(impl: Impl, module: str = "") -> Impl:
    """``impl`` with the fault of its target's module (or of ``module``, where it came from there)."""
    fault = import_fault(impl.target.partition(":")[0]) or (module and import_fault(module))
    return replace(impl, import_fault=fault) if fault else impl


def resolve(target: str) -> Callable:
    """Import MODULE:ATTR (ATTR may be dotted); a UsageError says what is wrong."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"--impl target {target!r} must be MODULE:ATTR")
    try:
        obj = _import(module)
    except ImportError as e:
        raise UsageError(f"--impl: cannot import module {module!r}: {e}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - SyntaxError, SystemExit, ...: the module's own failure
        first = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"--impl: importing module {module!r} raised {type(e).__name__}: {first}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"--impl: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"--impl: {target} is a {type(obj).__name__}, not a callable")
    return obj


def _import(module: str):
    """Import ``module``; like ``python -m``, a module in the current directory is found too."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0] or os.getcwd() in sys.path:
            raise
    sys.path.append(os.getcwd())
    return importlib.import_module(module)


def plugin(spec: str) -> Impl:
    """An Impl from ``OP=MODULE:ATTR`` or ``OP=MODULE:ATTR@CONVENTION`` (``conventions``)."""
    op, sep, target = spec.partition("=")
    if not sep:
        raise UsageError(f"--impl {spec!r} must look like OP=MODULE:ATTR or OP=MODULE:ATTR@CONVENTION")
    if op not in OPS:
        raise UsageError(f"--impl {spec!r}: unknown op {op!r}, expected one of {', '.join(OPS)}")
    base, convention = conventions.split(target)
    try:
        conventions.check(convention, OPS[op])  # before importing the module: the usage error comes first
    except ValueError as e:
        raise UsageError(f"--impl {spec!r}: {e}") from None
    fn = imported(lambda: resolve(base), base.partition(":")[0])
    if modules.is_module(fn):  # an nn.Module class or instance: the op's function of it
        try:
            fn = imported(lambda: modules.adapt(fn, OPS[op], target), base.partition(":")[0])
        except modules.ModuleError as e:
            raise UsageError(f"--impl {spec!r}: {e}") from None
    return _faulted(make(op, target, "plugin", fn, target=target, backward=None, convention=convention))


def _from_entry_points() -> list[Impl]:
    found = []
    for ep in entry_points(group="normcert.impls"):
        items = imported(lambda: list(ep.load()()), ep.module)  # noqa: B023 - called at once
        for item in items:
            if type(item) is not Impl:  # a subclass could run code of its own in place of the record's
                raise UsageError(f"entry point {ep.name!r} yielded {type(item).__name__}, expected normcert.impls.Impl")
            found.append(_faulted(item, ep.module))
    return found


def triton_installed() -> bool:
    """Can Triton be imported here?  It is optional (``pip install triton``): without it the
    registry has no Triton kernels, and a run says so (``properties.run.plugin``)."""
    return importlib.util.find_spec("triton") is not None


def registry(triton: bool = True) -> list[Impl]:
    """Every registered implementation (imports Triton: set TRITON_INTERPRET first); without
    Triton installed, or with ``triton=False`` (a run of given kernels, which needs the registry's
    eager ones alone and so imports no triton of its own), every one but the Triton modules'
    (``triton_installed``)."""
    impls: list[Impl] = []
    for name in MODULES:
        if name.startswith("normcert.impls.triton_") and not (triton and triton_installed()):
            continue
        impls.extend(_faulted(i) for i in imported(lambda: importlib.import_module(name), name).IMPLS)  # noqa: B023
    impls.extend(_from_entry_points())
    seen = set()
    for i in impls:
        if i.id in seen:
            raise UsageError(f"two implementations are registered as {i.id}")
        seen.add(i.id)
    return impls


def ensure_triton_mode(device: str) -> None:
    """Run Triton under its interpreter when there is no GPU (before importing triton)."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
