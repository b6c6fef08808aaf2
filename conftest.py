"""pytest wiring for normcert: options, which implementations each test runs on,
Hypothesis profiles, results for the certificate, and --replay.

    --impl OP=MODULE:ATTR   certify these callables only (repeatable)
    --device cpu|cuda       default: cuda when available
    --seed N                global seed; each test's Hypothesis seed derives from it
    --bitwise               make the bitwise properties gating
    --certificate PATH      write PATH (JSON) and PATH with .md (Markdown)
    --failures-dir DIR      where failing cases are saved (default failures/)
    --replay FILE           re-run one saved failing case
    --hypothesis-profile dev|ci|thorough   (Hypothesis's own option; ci by default)
"""
from __future__ import annotations

import dataclasses
import os

import hypothesis.core
import pytest
from hypothesis import settings

settings.register_profile("dev", max_examples=4, deadline=None)
settings.register_profile("ci", max_examples=12, deadline=None)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile("ci")

_COLLECTED: list[dict] = []


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
    g.addoption("--meta-seeds", type=int, default=1, help="global seeds each correct variant is certified under")


def _device(config) -> str:
    import torch  # noqa: PLC0415

    asked = config.getoption("--device")
    if asked == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: no CUDA device is available")
    return asked or ("cuda" if torch.cuda.is_available() else "cpu")


def pytest_configure(config):
    import impls  # noqa: PLC0415

    device = _device(config)
    impls.ensure_triton_mode(device)  # before anything imports triton
    from properties import certificate, harness  # noqa: PLC0415

    harness.CONFIG.update(seed=config.getoption("--seed"), device=device, bitwise=config.getoption("--bitwise"),
                          failures_dir=config.getoption("--failures-dir"))
    try:
        registry = impls.registry()
        plugins = [impls.plugin(s) for s in config.getoption("--impl")]
        replay = config.getoption("--replay")
        if replay:
            from properties import replay as rp  # noqa: PLC0415

            harness.CONFIG["replay"] = rp.load(replay, device)
    except (impls.UsageError, ValueError) as e:
        raise pytest.UsageError(str(e)) from None
    harness.CONFIG["eager"] = {i.op: i for i in registry if i.backend == "eager"}
    harness.CONFIG["impls"] = plugins or registry
    path = config.getoption("--certificate")
    if path:
        certificate.check_writable(path)
    torch_threads(config)
    if config.getoption("hypothesis_seed", None) is None:
        # plain @given tests (the oracle's own) draw from --seed too; the
        # properties set a per-test seed of their own (harness.derive_seed)
        hypothesis.core.global_force_seed = config.getoption("--seed")


def torch_threads(config):
    """One torch thread per xdist worker, so two workers do not fight over two cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch  # noqa: PLC0415

        torch.set_num_threads(1)


def pytest_generate_tests(metafunc):
    from oracle.formats import DTYPE_NAMES  # noqa: PLC0415
    from properties import harness  # noqa: PLC0415

    if "impl" in metafunc.fixturenames:
        applies = getattr(metafunc.module, "APPLIES", {}).get(metafunc.function.__name__, lambda impl: True)
        device = harness.CONFIG["device"]
        chosen = [i for i in harness.CONFIG["impls"] if applies(i) and device in i.devices]
        metafunc.parametrize("impl", chosen, ids=[i.id for i in chosen])
    if "dtype" in metafunc.fixturenames:
        metafunc.parametrize("dtype", list(DTYPE_NAMES), ids=list(DTYPE_NAMES.values()))


def pytest_collection_modifyitems(config, items):
    """--replay runs the replay test alone; otherwise the replay test is not collected.

    With --impl, only the properties of the plugged kernels run: the oracle's
    cross-check and the meta-tests certify the suite, not the kernel.
    """
    replaying = bool(config.getoption("--replay"))
    keep = [it for it in items if (it.module.__name__.endswith("test_replay")) == replaying]
    if config.getoption("--impl") and not replaying:
        keep = [it for it in keep if "impl" in getattr(it, "fixturenames", ())]
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    from properties import harness  # noqa: PLC0415

    start = len(harness.RESULTS)
    yield
    if item.module.__name__.startswith("properties.meta"):
        return  # the suite's self-test runs planted kernels: not part of any certificate
    for r in harness.RESULTS[start:]:
        item.user_properties.append(("normcert", dataclasses.asdict(r)))


def pytest_runtest_logreport(report):
    """Results reach the controller (also from xdist workers) on the test reports."""
    if report.when == "call" or (report.when == "setup" and report.skipped):
        for key, value in report.user_properties:
            if key == "normcert":
                _COLLECTED.append(value)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from properties import certificate  # noqa: PLC0415

    bad = certificate.unexpected_passes(_COLLECTED)
    if bad:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            "case studies expected to fail but passed every property: " + ", ".join(bad), red=True)
        session.exitstatus = 1
    path = session.config.getoption("--certificate")
    if path:
        certificate.write(path, _COLLECTED, session.config)
