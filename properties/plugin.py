"""normcert's pytest plugin (registered through the ``pytest11`` entry point).

It holds the options, the hooks that decide what each test runs on, the
Hypothesis profiles, the collection of results and the certificate, so that
``pytest --pyargs normcert.properties --impl OP=MODULE:ATTR`` works from any
directory once normcert is installed:

    --impl OP=MODULE:ATTR   certify these callables only (repeatable)
    --device cpu|cuda       default: cuda when available
    --seed N                global seed; each test's Hypothesis seed derives from it
    --bitwise               make the bitwise properties gating
    --certificate PATH      write PATH (JSON) and PATH with .md (Markdown)
    --failures-dir DIR      where failing cases are saved (default failures/)
    --replay FILE           re-run one saved failing case
    --meta-seeds K          global seeds each correct planted variant is certified under
    --hypothesis-profile dev|ci|thorough   (Hypothesis's own option; ci by default)

Test files are imported under their installed names (``normcert.properties.*``)
whatever path pytest was given, so a module never exists twice under two names.

Installed, the plugin loads into every pytest run of the environment, so it
stays inert unless the run collects normcert's tests (``_targets_normcert``):
only then does it pick the ``ci`` Hypothesis profile, force the seed, set
``TRITON_INTERPRET`` on CPU and register the ``Suite`` that does the work.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path

import hypothesis.core
import pytest
from hypothesis import settings

settings.register_profile("dev", max_examples=4, deadline=None)
settings.register_profile("ci", max_examples=12, deadline=None)
settings.register_profile("thorough", max_examples=300, deadline=None)

_PACKAGE = "normcert.properties"


def pytest_addoption(parser):
    g = parser.getgroup("normcert")
    g.addoption("--impl", action="append", default=[], metavar="OP=MODULE:ATTR",
                help="certify this callable for OP (repeatable); default: the whole registry")
    g.addoption("--device", default=None, choices=("cpu", "cuda"), help="default: cuda when available")
    g.addoption("--seed", type=int, default=0, help="global seed (per-test seeds derive from it)")
    g.addoption("--bitwise", action="store_true", help="bitwise properties fail the run")
    g.addoption("--certificate", default=None, metavar="PATH", help="write a JSON certificate and a .md beside it")
    g.addoption("--failures-dir", default="failures", metavar="DIR", help="where failing cases are saved")
    g.addoption("--replay", default=None, metavar="FILE", help="re-run one saved failing case")
    g.addoption("--meta-seeds", type=int, default=1, help="global seeds each correct planted variant is certified under")


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


def pytest_configure(config):
    if not _targets_normcert(config):
        used = [o for o in ("--impl", "--replay", "--certificate") if config.getoption(o)]
        if used:
            raise pytest.UsageError(f"{used[0]} needs normcert's tests in the run: add --pyargs normcert.properties "
                                    f"(or use the normcert command)")
        return
    config.pluginmanager.register(Suite(config), "normcert-suite")


def _device(config) -> str:
    import torch  # noqa: PLC0415

    asked = config.getoption("--device")
    if asked == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: no CUDA device is available")
    return asked or ("cuda" if torch.cuda.is_available() else "cpu")


def _torch_threads():
    """One torch thread per xdist worker, so two workers do not fight over two cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch  # noqa: PLC0415

        torch.set_num_threads(1)


class Suite:
    """A normcert run: which kernels, the results gathered (on the controller), the certificate."""

    def __init__(self, config):
        from normcert import impls  # noqa: PLC0415

        self.config = config
        self.results: list[dict] = []
        device = _device(config)
        impls.ensure_triton_mode(device)  # before anything imports triton
        from normcert.properties import certificate, harness  # noqa: PLC0415

        harness.CONFIG.update(seed=config.getoption("--seed"), device=device, bitwise=config.getoption("--bitwise"),
                              failures_dir=config.getoption("--failures-dir"))
        try:
            registry = impls.registry()
            plugins = [impls.plugin(s) for s in config.getoption("--impl")]
            replay = config.getoption("--replay")
            if replay:
                from normcert.properties import replay as rp  # noqa: PLC0415

                harness.CONFIG["replay"] = rp.load(replay, device)
        except (impls.UsageError, ValueError) as e:
            raise pytest.UsageError(str(e)) from None
        harness.CONFIG["eager"] = {i.op: i for i in registry if i.backend == "eager"}
        harness.CONFIG["impls"] = plugins or registry
        path = config.getoption("--certificate")
        if path:
            certificate.check_writable(path)
        _torch_threads()
        if config.getoption("hypothesis_profile", None) is None:
            settings.load_profile("ci")
        if config.getoption("hypothesis_seed", None) is None:
            # plain @given tests (the oracle's own) draw from --seed too; the
            # properties set a per-test seed of their own (harness.derive_seed)
            hypothesis.core.global_force_seed = config.getoption("--seed")

    def pytest_generate_tests(self, metafunc):
        from normcert.oracle.formats import DTYPE_NAMES  # noqa: PLC0415
        from normcert.properties import harness  # noqa: PLC0415

        if not metafunc.module.__name__.startswith(_PACKAGE + "."):
            return
        if "impl" in metafunc.fixturenames:
            applies = getattr(metafunc.module, "APPLIES", {}).get(metafunc.function.__name__, lambda impl: True)
            device = harness.CONFIG["device"]
            chosen = [i for i in harness.CONFIG["impls"] if applies(i) and device in i.devices]
            metafunc.parametrize("impl", chosen, ids=[i.id for i in chosen])
        if "dtype" in metafunc.fixturenames:
            metafunc.parametrize("dtype", list(DTYPE_NAMES), ids=list(DTYPE_NAMES.values()))

    def pytest_collection_modifyitems(self, config, items):
        """--replay runs the replay test alone; otherwise the replay test is not collected.

        With --impl, only the properties of the plugged kernels run: the oracle's
        cross-check and the meta-tests certify the suite, not the kernel.
        """
        replaying = bool(config.getoption("--replay"))
        plugged = bool(config.getoption("--impl"))

        def keep(item) -> bool:
            name = item.module.__name__
            if not name.startswith(_PACKAGE + "."):
                return True
            if (name == _PACKAGE + ".test_replay") != replaying:
                return False
            return replaying or not plugged or "impl" in getattr(item, "fixturenames", ())

        items[:] = [it for it in items if keep(it)]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        from normcert.properties import harness  # noqa: PLC0415

        start = len(harness.RESULTS)
        yield
        if item.module.__name__.startswith(_PACKAGE + ".meta"):
            return  # the suite's self-test runs planted kernels: not part of any certificate
        for r in harness.RESULTS[start:]:
            item.user_properties.append(("normcert", dataclasses.asdict(r)))

    def pytest_runtest_logreport(self, report):
        """Results reach the controller (also from xdist workers) on the test reports."""
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.results.extend(value for key, value in report.user_properties if key == "normcert")

    def pytest_sessionfinish(self, session, exitstatus):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return
        from normcert.properties import certificate  # noqa: PLC0415

        bad = certificate.unexpected_passes(self.results)
        if bad:
            session.config.pluginmanager.get_plugin("terminalreporter").write_line(
                "case studies expected to fail but passed every property: " + ", ".join(bad), red=True)
            session.exitstatus = 1
        path = session.config.getoption("--certificate")
        if path:
            certificate.write(path, self.results, session.config)
