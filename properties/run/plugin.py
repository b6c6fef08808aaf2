"""normcert's pytest plugin (registered through the ``pytest11`` entry point).

It holds the options, the hooks that decide what each test runs on, the
Hypothesis profiles, the collection of results and the certificate, so that
``pytest --pyargs normcert.properties.suite --normcert-impl OP=MODULE:ATTR`` works
from any directory once normcert is installed (every option carries the
``normcert-`` prefix, so that an installed plugin claims no name another
project's conftest may use, such as ``--device`` or ``--seed``; ``normcert
certify`` takes the short forms):

    --normcert-impl OP=MODULE:ATTR   certify these callables only (repeatable)
    --normcert-agree OP=MODULE:ATTR  certify these too, each op's kernels giving the same bits
                                     as its first (repeatable: two or more per op)
    --normcert-domain SPEC           their declared domain (``properties.declared.domain``), replacing a normcert_domain attribute
    --normcert-compile               check them as a compiled model calls them too (``families.compiled``)
    --normcert-tier quick|heavy|all   quick (default) leaves the heavy tier out: on CPU the registry's Triton kernels and the normcert_heavy meta-tests
    --normcert-device cpu|cuda       default: cuda when available
    --normcert-seed N                global seed; each test's Hypothesis seed derives from it
    --normcert-bitwise               make the bitwise properties gating
    --normcert-certificate PATH      write PATH (JSON) and PATH with .md (Markdown)
    --normcert-failures-dir DIR      where failing cases are saved (default failures/)
    --normcert-replay FILE           re-run one saved failing case
    --normcert-kernel-timeout S      a kernel call with no result nor progress for S seconds is hung (default 60)
    --normcert-meta-seeds K          global seeds each correct planted variant is certified under
    --normcert-property P   the run's declared scope: only these property families (repeatable)
    --normcert-dtype D      the run's declared scope: only these dtypes (repeatable)
    --normcert-shard K/N    run the K-th of N shards of the scope's checks (``evidence.shards``)
    --hypothesis-profile dev|ci|thorough|large   (Hypothesis's own option; ci by default;
                            large: ci plus cases past 2**31 elements, on a GPU)

Test files are imported under their installed names (``normcert.properties.*``)
whatever path pytest was given, so a module never exists twice under two names.
A run that certifies or replays a kernel collects the suite's folder alone
(``SUITE``, by its path or its ``--pyargs`` name; anything else is a usage error):
normcert's own tests live beside it (``normcert.properties.tests``), not in it.

Installed, the plugin loads into every pytest run of the environment, so it
stays inert unless the run collects normcert's tests (``_targets_normcert``):
only then does it pick the ``ci`` Hypothesis profile, force the seed, set
``TRITON_INTERPRET`` on CPU and register the ``Suite`` that does the work.

Imports: this module imports nothing heavy at the top (no torch, no kernel, no
property module), so that it stays cheap in every pytest run of the environment,
including the runs that do not use it; what a normcert run needs is imported
inside the hooks that only such a run reaches.  A kernel's module is imported
only after the incomplete certificate is written (``Suite.__init__``), so that a
kernel that kills the process at import still leaves an incomplete certificate.
Elsewhere in normcert an import inside a function says why (an optional
dependency such as Triton, or this policy); all others sit at the top.

Evidence: the verdict is "certified" only when every (kernel, property, dtype)
of the run's scope left a result (``families.expected``), whatever narrowed the
run (``-k``, ``-m``, ``--co``, an ini file's addopts, an xdist worker's
deselection).  The incomplete certificate is written before any kernel module
is imported.  With ``NORMCERT_RUN_RECORD`` set (``normcert certify`` does), the
controller writes its verdict there as its last step, so a parent process can
tell a finished run from one that a kernel ended with ``os._exit``.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import time
from pathlib import Path

import hypothesis.core
import pytest
from hypothesis import settings

from ..evidence import code, shards
from ..harness import launches
from ..harness.run_settings import KERNEL_TIMEOUT, PROFILES, RUN_RECORD
from . import news
from . import scope
from . import warmup
from .announce import Announcer, note


def flag(name: str) -> str:
    """How the user gave option ``name``: ``--name`` to ``normcert certify`` / ``replay`` (which run
    pytest with ``NORMCERT_RUN_RECORD`` set), ``--normcert-name`` to pytest: messages name that one."""
    return f"--{name}" if os.environ.get(RUN_RECORD) else f"--normcert-{name}"


def _register_profiles():
    """normcert's Hypothesis profiles, registered only in a run that collects normcert's tests:
    ``ci`` replaces Hypothesis's built-in profile of that name, which Hypothesis loads by itself
    when the environment says CI (``CI=true``), so registering at import would change the
    examples of every other project's tests on a CI machine."""
    for name, examples in PROFILES.items():
        settings.register_profile(name, max_examples=examples, deadline=None)

_PACKAGE = "normcert.properties"
SUITE = _PACKAGE + ".suite"  # what a certify or replay run collects: this folder alone


def pytest_addoption(parser):
    g = parser.getgroup("normcert")
    g.addoption("--normcert-impl", action="append", default=[], metavar="OP=MODULE:ATTR",
                help="certify this callable for OP (repeatable); default: the whole registry")
    g.addoption("--normcert-agree", action="append", default=[], metavar="OP=MODULE:ATTR",
                help="certify this callable for OP and require the same bits as the first --normcert-agree kernel "
                     "of OP (give two or more per op)")
    g.addoption("--normcert-device", default=None, choices=("cpu", "cuda"), help="default: cuda when available")
    g.addoption("--normcert-seed", type=int, default=0, help="global seed (per-test seeds derive from it)")
    g.addoption("--normcert-bitwise", action="store_true", help="bitwise properties fail the run")
    g.addoption("--normcert-require-backward", action="store_true",
                help="a kernel whose outputs carry no grad_fn fails gradients and gradcheck (default: "
                     "not certified, forward only)")
    g.addoption("--normcert-certificate", default=None, metavar="PATH", help="write a JSON certificate and a .md beside it")
    g.addoption("--normcert-failures-dir", default="failures", metavar="DIR", help="where failing cases are saved")
    g.addoption("--normcert-replay", default=None, metavar="FILE", help="re-run one saved failing case")
    g.addoption("--normcert-kernel-timeout", type=float, default=KERNEL_TIMEOUT, metavar="SECONDS",
                help="a kernel call with neither a result nor progress (programs of an interpreted Triton "
                     "launch) for this long is hung: the result it belongs to fails")
    g.addoption("--normcert-meta-seeds", type=int, default=1, help="global seeds each correct planted variant is certified under")
    g.addoption("--normcert-domain", default=None, metavar="SPEC",
                help="the declared domain of every --normcert-impl kernel, e.g. 'dtypes=float16,bfloat16 width_multiple=8' "
                     "(replaces its normcert_domain attribute; keys in docs/reference/op-contracts.md)")
    g.addoption("--normcert-tier", default="quick", choices=scope.TIERS,
                help="quick (default): everything but the heavy tier; heavy: only the heavy tier (on CPU the "
                     "registry's Triton kernels, interpreted, and the meta-tests marked normcert_heavy); all: both")
    g.addoption("--normcert-compile", action="store_true",
                help="check every --normcert-impl kernel as a compiled model calls it (the compiled family: "
                     "torch.library.opcheck, torch.compile(fullgraph=True)); a torch operator always is")
    g.addoption("--normcert-property", action="append", default=[], metavar="NAME",
                help="declare the run's scope: only these property families (repeatable, or comma-separated); "
                     "the certificate states it")
    g.addoption("--normcert-dtype", action="append", default=[], metavar="DTYPE",
                help="declare the run's scope: only these dtypes (repeatable, or comma-separated)")
    g.addoption("--normcert-shard", metavar="K/N", help="run shard K of N of the checks (normcert merge joins them)")


# ------------------------------------------------------------------ collection under installed names
def _root() -> Path:
    return Path(importlib.import_module(_PACKAGE).__file__).parent


def _installed_name(path: Path) -> str | None:
    """``normcert.properties.X`` for a file inside the installed properties package, else None."""
    root = _root()
    try:
        rel = Path(os.path.abspath(path)).relative_to(root)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([_PACKAGE, *parts])


class _InstalledModule(pytest.Module):
    def _getobj(self):
        return importlib.import_module(_installed_name(self.path))


class _InstalledPackage(pytest.Package):
    def setup(self) -> None:
        importlib.import_module(_installed_name(self.path / "__init__.py"))


def pytest_pycollect_makemodule(module_path, parent):
    if _installed_name(module_path):
        return _InstalledModule.from_parent(parent, path=module_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path, parent):
    if (path / "__init__.py").is_file() and _installed_name(path / "__init__.py"):
        return _InstalledPackage.from_parent(parent, path=path)
    return None


# ------------------------------------------------------------------ configuration
def _targets_normcert(config) -> bool:
    """Does this run collect normcert's tests (by path, or by ``--pyargs normcert...``)?"""
    root = _root().resolve()
    for arg in config.args:
        arg = arg.split("::")[0]
        if config.option.pyargs and (arg == "normcert" or arg.startswith("normcert.")):
            return True
        path = (config.invocation_params.dir / arg).resolve()
        if path == root or root in path.parents or path in root.parents:
            return True
    return False


def _arguments_in(config, package: str) -> list[bool]:
    """For each argument of the run: does it collect ``package`` or a part of it (a ``--pyargs``
    name, or a path to its folder or to something in it)?"""
    folder = Path(importlib.import_module(package).__file__).parent.resolve()
    inside = []
    for arg in config.args:
        arg = arg.split("::")[0]
        if config.option.pyargs and (arg == package or arg.startswith(package + ".")):
            inside.append(True)
            continue
        path = (config.invocation_params.dir / arg).resolve()
        inside.append(path == folder or folder in path.parents)
    return inside


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's plugin loads the profile
def pytest_configure(config):
    if not _targets_normcert(config):
        used = [o for o in ("--normcert-impl", "--normcert-agree", "--normcert-replay", "--normcert-certificate")
                if config.getoption(o)]
        if used:
            raise pytest.UsageError(f"{used[0]} needs normcert's suite in the run: add --pyargs {SUITE} "
                                    f"(or use the normcert command)")
        return
    plugged = [o for o in ("--normcert-impl", "--normcert-agree", "--normcert-replay") if config.getoption(o)]
    if plugged and not all(_arguments_in(config, SUITE)):
        raise pytest.UsageError(f"{plugged[0]} runs normcert's suite alone: give --pyargs {SUITE} or its folder "
                                f"(normcert's own tests, {_PACKAGE}.tests, are never part of a certificate)")
    _register_profiles()
    config.addinivalue_line("markers", "normcert_family(name): the property family (families.BY_NAME) this test runs")
    config.addinivalue_line("markers", "normcert_heavy: a meta-test of the heavy tier (--normcert-tier heavy or all)")
    profile = config.getoption("hypothesis_profile", None)
    if profile is not None and profile not in PROFILES:
        raise pytest.UsageError(f"--hypothesis-profile {profile}: unknown profile, expected one of "
                                f"{', '.join(PROFILES)}")
    config.pluginmanager.register(Suite(config), "normcert-suite")


def _plugged(config) -> bool:
    """Are kernels plugged in (--impl or --agree)?  Then only their properties run."""
    return bool(config.getoption("--normcert-impl") or config.getoption("--normcert-agree"))


def _device(config) -> str:
    import torch  # noqa: PLC0415

    asked = config.getoption("--normcert-device")
    if asked == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"{flag('device')} cuda: no CUDA device is available")
    return asked or ("cuda" if torch.cuda.is_available() else "cpu")


def _agreeing(plugins: list, specs: list[str]) -> list:
    """The --impl kernels and the --agree kernels: each --agree kernel of an op after the first
    must agree with the first (``Impl.agrees_with``); one the --impl list also names is listed once."""
    from ... import impls  # noqa: PLC0415

    groups: dict[str, list] = {}
    for spec in dict.fromkeys(specs):  # a kernel named twice is one kernel
        i = impls.plugin(spec)
        groups.setdefault(i.op, []).append(i)
    agreeing = []
    for op, group in groups.items():
        if len(group) < 2:
            raise impls.UsageError(f"{flag('agree')} {op}={group[0].target}: give a second kernel of {op} "
                                   f"for it to agree with")
        ids = [i.id for i in group]
        if len(set(ids)) < len(ids):
            raise impls.UsageError(f"{flag('agree')}: two kernels of {op} share the name {group[0].id!r}; "
                                   f"agreement needs them told apart")
        domains = {i.domain.spec() or "all" for i in group}
        if len(domains) > 1:
            raise impls.UsageError(f"{flag('agree')}: the kernels of {op} declare different domains "
                                   f"({'; '.join(sorted(domains))}): agreement is checked on one; give it with "
                                   f"{flag('domain')}")
        agreeing += [group[0]] + [dataclasses.replace(i, agrees_with=group[0]) for i in group[1:]]
    named = {(i.op, i.target) for i in agreeing}
    return [i for i in plugins if (i.op, i.target) not in named] + agreeing


def _with_domain(plugins: list, declared) -> list:
    """The kernels with ``declared`` as their domain (``impls.with_domain``: one their op cannot be
    checked on is a usage error naming --domain), the kernel each must agree with too."""
    from ... import impls  # noqa: PLC0415

    out = {}
    for i in plugins:  # the kernel agreed with first: it precedes those that agree with it
        partner = i.agrees_with and out.get(i.agrees_with.id)
        out[i.id] = impls.with_domain(i, declared, f"{flag('domain')} (for {i.id})",
                                      **({"agrees_with": partner} if partner else {}))
    return list(out.values())


PLANTED = "normcert.properties.tests.meta.planted"
PLANTED_MODULES = ("rms_norms", "shapes", "gated_norm", "norm_quant", "fp4", "activation_quant", "layer_norms",
                   "batch_norm", "activations", "conventions", "fp4_rules")
"""The planted package's modules (``properties/tests/meta/planted/``), named here rather than found by
importing it, since this module imports no kernel at the top (``test_expect`` checks the names)."""

REPLAYABLE = (PLANTED, *(f"{PLANTED}.{name}" for name in PLANTED_MODULES),
              "normcert.properties.tests.meta.planted_triton")
"""Modules outside the registry whose kernels a replay file may name by itself: the planted bugs, by the
package (which re-exports every one) or by the module that defines it (a kernel's own ``__module__``,
the target ``impls.make`` gives it by default)."""


RENAMED = {"normcert.properties.meta.planted": PLANTED,
           "normcert.properties.meta.planted_triton": "normcert.properties.tests.meta.planted_triton"}
"""The planted modules' names before the house move (issue 44), as a replay file written then names them."""


def _spec(impl) -> str:
    """How a kernel is named on the command line and in a replay file: OP=MODULE:ATTR."""
    return f"{impl.op}={impl.target}"


def _replay_target(path: str, meta: dict, registry, plugins):
    """The implementation a replay runs: one given with --impl for the op, else the file's own
    target if it is in the registry or is a planted kernel (``REPLAYABLE``, a plain function
    name: ``normcert.impls:os.system`` is not one); any other target is refused, since a replay
    file (an artifact from anywhere) must not choose what gets imported.  An agreement failure's
    file names the kernel it must agree with too (``agrees_with``): given with --impl by that
    name, or trusted by the same rule."""
    partner = meta.get("agrees_with", "")
    mine = sorted((i for i in plugins if i.op == meta["op"] and _spec(i) != partner),
                  key=lambda i: _spec(i) != meta["impl"])  # the file's own kernel first, where given
    impl = _trusted(path, meta["impl"], meta["op"], registry, mine)
    if meta["property"] == "compiled":  # a kernel given --compile then: replayed compiled
        impl = dataclasses.replace(impl, compiles=True)
    if not partner:
        return impl
    other = _trusted(path, partner, meta["op"], registry, [i for i in plugins if _spec(i) == partner])
    return dataclasses.replace(impl, agrees_with=other)


def _trusted(path: str, named: str, op_name: str, registry, plugged):
    """The kernel a replay file names as ``named``: the first of ``plugged``, else a registry
    entry or a planted kernel of that name (a planted module's name from before the house move read as
    its own, ``RENAMED``); else a usage error saying how to trust it."""
    from ... import impls  # noqa: PLC0415

    if plugged:
        return plugged[0]
    known = [i for i in registry if _spec(i) == named]
    if known:
        return known[0]
    op, _, target = named.partition("=")
    module, _, attr = target.partition(":")
    if module in RENAMED:
        module, target = RENAMED[module], f"{RENAMED[module]}:{attr}"
        named = f"{op}={target}"
    if op != op_name or module not in REPLAYABLE or not attr.partition("@")[0].isidentifier():
        raise pytest.UsageError(f"{flag('replay')} {path}: the file names the kernel {named!r}, which is not in "
                                f"normcert's registry; if you trust it, pass {flag('impl')} {named}")
    said = f"normcert replay: importing {target}, named by {path}"
    print(said)
    news.tell("note", line=said)
    return impls.plugin(named)


class Suite:
    """A normcert run: which kernels, the results gathered (on the controller), the certificate."""

    def __init__(self, config):
        from ... import impls  # noqa: PLC0415

        self.config = config
        self.results: list[dict] = []
        self.deselected: list[str] = []
        self.crashed: list[str] = []
        self.replayed: str | None = None  # a replay's outcome: "pass" (the property holds) or "fail"
        self.code: dict[str, dict] = {}  # kernel id -> the code it runs (``evidence.code``), for the certificate
        self.controller = not os.environ.get("PYTEST_XDIST_WORKER")
        from ..evidence import certificate  # noqa: PLC0415 - no torch: usage errors come fast

        certificate.check_failures_dir(config.getoption("--normcert-failures-dir"), flag("failures-dir"))
        timeout = config.getoption("--normcert-kernel-timeout")
        if not 0 < timeout < float("inf"):
            raise pytest.UsageError(f"{flag('kernel-timeout')} {timeout}: expected a finite number of seconds > 0")
        # resolved now: a kernel that changes the working directory must not move the run's files
        self.certificate = config.getoption("--normcert-certificate") and os.path.abspath(config.getoption("--normcert-certificate"))
        if self.certificate:
            certificate.check_writable(self.certificate, flag("certificate"))
        device = _device(config)
        impls.ensure_triton_mode(device)  # before anything imports triton
        from .runner import MOST_FAILURES  # noqa: PLC0415
        from ..harness.session import Session  # noqa: PLC0415
        from ..search.buckets import LONG_RUN_CALLS, LONG_RUN_EVERY, QUICK_LONG_RUN, QUICK_LONG_RUN_EVERY  # noqa: PLC0415

        self.session = Session(device=device, seed=config.getoption("--normcert-seed"), bitwise=config.getoption("--normcert-bitwise"),
                               require_backward=config.getoption("--normcert-require-backward"),
                               failures_dir=os.path.abspath(config.getoption("--normcert-failures-dir")),
                               kernel_timeout=timeout,
                               profile=config.getoption("hypothesis_profile", None) or "ci",
                               most_failures=MOST_FAILURES)
        self.session.beat()  # before any kernel's module is imported: an import that hangs stops the beat
        warmup.build_oracle(config)  # beside the rest of the start, before any kernel code runs
        from ...oracle.formats import DTYPE_NAMES  # noqa: PLC0415
        from ..families import BY_NAME  # noqa: PLC0415

        self.families = BY_NAME
        self.scope = {"properties": scope.names(config, "--normcert-property", BY_NAME),
                      "dtypes": scope.names(config, "--normcert-dtype", DTYPE_NAMES.values())}
        if self.certificate and self.controller:  # before any kernel's module is imported: replaced at the end
            certificate.write_incomplete(self.certificate, f"started {time.strftime('%Y-%m-%d %H:%M:%S')} and did "
                                                           f"not finish (crashed or killed)")
        try:
            given = config.getoption("--normcert-shard")
            self.shard, self.checks = (shards.parse(given, flag("shard")) if given else None), []
            plugins = [impls.plugin(s) for s in config.getoption("--normcert-impl")]
            plugins = _agreeing(plugins, config.getoption("--normcert-agree"))
            spec = config.getoption("--normcert-domain")
            if spec is not None:
                if not plugins:
                    raise impls.UsageError(f"{flag('domain')} declares the domain of the {flag('impl')} kernels: "
                                           f"give {flag('impl')} too")
                declared = impls.parse(spec, where=flag("domain"))
                plugins = _with_domain(plugins, declared)
            if config.getoption("--normcert-compile"):
                if not plugins:
                    raise impls.UsageError(f"{flag('compile')} checks the {flag('impl')} kernels compiled: "
                                           f"give {flag('impl')} too")
                plugins = [dataclasses.replace(i, compiles=True) for i in plugins]
            replay = config.getoption("--normcert-replay")
            registry = impls.registry(triton=not plugins or bool(replay))  # beside given kernels: its eager ones
            if replay:
                from ..evidence import replay as rp  # noqa: PLC0415

                self.session.replay = meta, case = rp.load(replay, device)
                self.session.replay_impl = _replay_target(replay, meta, registry, plugins)
                try:  # the file's config, by content, is one the kernel has here
                    self.session.forcing(self.session.replay_impl).select(case.config)
                except ValueError as e:
                    raise impls.UsageError(f"{flag('replay')} {replay}: {e}") from None
        except (impls.UsageError, ValueError) as e:  # the incomplete certificate says so, not "crashed or killed"
            raise certificate.refused(self.certificate if self.controller else None, str(e)) from None
        from ..harness import interpreter  # noqa: PLC0415 - after the kernels: imports triton only if they did

        self.session.interpreter = interpreter.install() if interpreter.imported() else None
        self.session.eager = {i.op: i for i in registry if i.backend == "eager"}
        self.tier = "all" if plugins or replay else config.getoption("--normcert-tier")
        self.session.impls = plugins or scope.tiered(registry, self.tier, device)
        if self.certificate and self.controller:  # the code as imported for the run, before any check
            self.code = code.of({i.id: i.target for i in self.session.impls})
        quick = self.tier == "quick" and device == "cpu"  # the registry's CPU kernels, in the clone
        self.session.long_run = QUICK_LONG_RUN if quick else LONG_RUN_CALLS  # (``buckets.QUICK_LONG_RUN``)
        self.session.long_run_every = QUICK_LONG_RUN_EVERY if quick else LONG_RUN_EVERY
        self.session.dtypes = self.scope["dtypes"] and tuple(self.scope["dtypes"])
        self.tier_left = len(registry) - len(self.session.impls) if not plugins else 0
        warmup.torch_threads()
        if config.getoption("hypothesis_profile", None) is None:
            settings.load_profile("ci")
        if config.getoption("hypothesis_seed", None) is None:
            # plain @given tests (the oracle's own) draw from --seed too; the
            # properties set a per-test seed of their own (Session.derive_seed)
            hypothesis.core.global_force_seed = config.getoption("--normcert-seed")
        if self.controller and news.listening():  # the command's console (``announce``)
            config.pluginmanager.register(Announcer(self), "normcert-announcer")

    def pytest_generate_tests(self, metafunc):
        from ...oracle.formats import DTYPE_NAMES  # noqa: PLC0415

        if not metafunc.module.__name__.startswith(_PACKAGE + "."):
            return
        if "impl" in metafunc.fixturenames:
            family = self.family(metafunc.definition)
            chosen = [i for i in self.session.impls if self.session.device in i.devices
                      and (family is None or family.covers(i, self.session.bitwise))]
            metafunc.parametrize("impl", chosen, ids=[i.id for i in chosen])
        if "dtype" in metafunc.fixturenames:
            dtypes = [d for d, name in DTYPE_NAMES.items() if self.scope["dtypes"] is None or name in self.scope["dtypes"]]
            metafunc.parametrize("dtype", dtypes, ids=[DTYPE_NAMES[d] for d in dtypes])

    def pytest_collection_modifyitems(self, config, items):
        """--replay runs the replay test alone; otherwise the replay test is not collected.

        With --impl, only the properties of the plugged kernels run: the oracle's
        cross-check and the meta-tests certify the suite, not the kernel.
        A declared scope (--normcert-property, --normcert-dtype) drops the families outside it.
        """
        replaying = bool(config.getoption("--normcert-replay"))
        plugged = _plugged(config)
        properties, dtypes = self.scope["properties"], self.scope["dtypes"]
        mine, every = (set(self.expected()), set(self.checks)) if self.shard and not replaying else (None, None)

        def in_scope(item) -> bool:
            family = self.family(item)
            if family is None:
                return True
            if family.name == "gradcheck" and dtypes is not None and "float64" not in dtypes:
                return False
            return properties is None or family.name in properties

        def keep(item) -> bool:
            name = item.module.__name__
            if not name.startswith(_PACKAGE + "."):
                return True
            if (name == SUITE + ".test_replay") != replaying:
                return False
            if not in_scope(item) or (mine is not None and not scope.in_shard(
                    item, self.family(item), mine, every, self.shard[0] == 1)):
                return False
            return replaying or not plugged or "impl" in getattr(item, "fixturenames", ())

        items[:] = [it for it in items if keep(it)]
        for item in items:
            heavy = item.get_closest_marker("normcert_heavy") is not None
            if self.tier == "quick" and heavy:
                item.add_marker(pytest.mark.skip(reason="the heavy tier's (--normcert-tier heavy or all)"))
            elif self.tier == "heavy" and not heavy and "impl" not in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.skip(reason="the quick tier's (--normcert-tier quick or all)"))

    def family(self, node):
        """The property family a test names with its ``normcert_family`` mark (None: it runs none)."""
        mark = node.get_closest_marker("normcert_family")
        return None if mark is None else self.families[mark.args[0]]

    @pytest.fixture
    def normcert_session(self):
        """The run's ``Session``: settings, kernels under test, results."""
        return self.session

    @pytest.fixture
    def normcert_family(self, request):
        """The property family (``families.Family``) the test's ``normcert_family`` mark names."""
        return self.family(request.node)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session):
        from .outcomes import without_torch_trace  # noqa: PLC0415  (torch: a normcert run's alone)

        without_torch_trace(session.config)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        start = len(self.session.results)
        launches.take()  # its rows hold its own launches, none a test before it made (a meta-test's)
        yield
        if item.module.__name__.startswith(_PACKAGE + ".tests.meta"):
            return  # the suite's self-test runs planted kernels: not part of any certificate
        for r in self.session.results[start:]:
            item.user_properties.append(("normcert", dataclasses.asdict(r)))

    def pytest_collectreport(self, report):
        self.session.beat()

    def pytest_runtest_logstart(self, nodeid, location):
        self.session.beat()

    def pytest_runtest_logreport(self, report):
        """Results reach the controller (also from xdist workers) on the test reports."""
        self.session.beat()
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.results.extend(value for key, value in report.user_properties if key == "normcert")
            self.replayed = next((v for k, v in report.user_properties if k == "normcert-replay"), self.replayed)
        if report.failed and "crashed while running" in str(report.longrepr):  # xdist's report of a dead worker
            self.crashed.append(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter):
        """What was not certified, and each non-gating finding (a ``warn`` row), in plain words, whatever
        -r says about skips or -W about warnings."""
        if not self.controller:
            return
        if self.tier != "all":
            note(terminalreporter, f"normcert: tier {self.tier}: {self.tier_left} registry kernels and the "
                                        f"{'quick' if self.tier == 'heavy' else 'heavy'} meta-tests run under "
                                        f"--normcert-tier {'quick' if self.tier == 'heavy' else 'heavy'} (or all)")
        from ... import impls  # noqa: PLC0415

        if not _plugged(self.config) and not impls.triton_installed():
            note(terminalreporter, "normcert: Triton is not installed here: the registry's Triton kernels were "
                                        "not run (pip install triton==3.7.1)", yellow=True)
        forward_only = sorted({r["impl"] for r in self.results if r["outcome"] == "not-certified"})
        for impl in forward_only:
            note(terminalreporter, f"normcert: {impl} not certified for gradients or gradcheck: forward only "
                                        f"(its outputs carry no grad_fn; --require-backward makes this a failure)",
                                        yellow=True)
        for r in self.results:  # said here, not with warnings.warn: -W error would make it the kernel's failure
            if r["outcome"] == "warn":
                note(terminalreporter, f"normcert: {r['prop']} (not gating without --bitwise): {r['impl']} in "
                                            f"{r['dtype']}: {r['message']}", yellow=True)

    def pytest_deselected(self, items):
        self.deselected.extend(item.nodeid for item in items)

    def expected(self) -> list[str]:
        """Every check "kernel id property dtype" of the run's scope (``families.expected``), its shard's."""
        from .. import families  # noqa: PLC0415

        s = self.session
        self.checks = sorted(" ".join(k) for k in families.expected(s.impls, s.device, s.bitwise, s.profile, **self.scope))
        return shards.assigned(self.checks, self.shard)

    @pytest.hookimpl(trylast=True)  # after every other plugin's and conftest.py's: the verdict is ours
    def pytest_sessionfinish(self, session, exitstatus):
        if not self.controller:
            return
        from ..evidence import certificate, verdict  # noqa: PLC0415

        report = session.config.pluginmanager.get_plugin("terminalreporter")
        bad = certificate.unexpected_passes(self.results)
        if bad:
            note(report, "case studies expected to fail but passed every property: " + ", ".join(bad), red=True)
            session.exitstatus = 1
        replaying = bool(session.config.getoption("--normcert-replay"))
        expected = [] if replaying else self.expected()
        done = {verdict.key(r) for r in self.results}
        missing = [k for k in expected if k not in done]
        # a certification run (kernels plugged in, or a certificate asked for) that left checks undone
        certifying = not replaying and (_plugged(session.config) or bool(self.certificate))
        if missing and certifying:
            report.ensure_newline()
            note(report, f"normcert: not certified: {len(missing)} check(s) of the run's scope did not run, "
                              f"e.g. {missing[0]} (narrowed by -k, -m, --co or the run's configuration; "
                              f"--normcert-property / --normcert-dtype declare a scope)", red=True)
        status = int(session.exitstatus)
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):  # a Ctrl-C unwinding past pytest's handler
            # (a 2nd SIGINT during it, as timeout -s INT sends) left the session's initial 0: interrupted
            session.exitstatus = status = int(pytest.ExitCode.INTERRUPTED)
        stopped = session.shouldstop or session.shouldfail  # -x, --maxfail: not every test ran
        state = "interrupted" if status == pytest.ExitCode.INTERRUPTED else (
            f"stopped early: {stopped}" if stopped else "complete")
        judged, disagreement = verdict.judge(self.results, expected, status, self.crashed, state, certifying, self.shard)
        if disagreement:
            note(report, f"normcert: not certified: {disagreement}", red=True)
        self.failed_run = (judged not in verdict.PASSED and certifying) or bool(disagreement) or (
            replaying and self.replayed != "pass")
        if self.failed_run and status == 0:
            session.exitstatus = status = 1
        run = {"run": state, "verdict": judged, "disagreement": disagreement, "pytest_exit_status": status,
               "deselected": self.deselected, "crashed": self.crashed, "not_run": missing if certifying else [],
               "expected": expected, "scope": {k: v or "all" for k, v in self.scope.items()},
               "domains": {i.id: i.domain.describe() for i in self.session.impls}, "replayed": self.replayed,
               "shard": shards.record(self.shard, self.checks)}
        if self.certificate:
            try:
                cert = certificate.write(self.certificate, self.session, self.results, session.config, run, self.code)
                if not os.environ.get(RUN_RECORD):  # under ``normcert certify`` its parent writes it, judged again
                    certificate.append_step_summary(cert)
            except OSError as e:  # its folder removed or made read-only mid-run (by the kernel, say), a link
                note(report, f"normcert: not certified: the certificate {self.certificate} could not be "
                                  f"written ({e.strerror or e})", red=True)
                run["verdict"] = "not certified"
                self.failed_run = True
                session.exitstatus = run["pytest_exit_status"] = status or 1
        self.session_ref = session
        record = os.environ.get(RUN_RECORD)
        if record:  # the last step: a parent reading no record knows the run never got here
            from ..evidence.files import write_atomic  # noqa: PLC0415

            write_atomic(record, json.dumps({**run, "results": self.results}, default=str))

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        """The exit status once more, after every other plugin's last word: a run that is not
        certified (``pytest_sessionfinish``) never exits 0, whatever set ``session.exitstatus`` since."""
        session = getattr(self, "session_ref", None)
        if session is not None and self.failed_run and session.exitstatus == 0:
            session.exitstatus = 1
