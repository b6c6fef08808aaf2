"""Autotuned Triton kernels are certified or rejected on their merits, under every config.

On CPU an autotuned kernel used to die in Triton's benchmarker ("0 active drivers") and fail every
property for a reason of ours.  Now each case runs under one of the kernel's configs, forced
(``properties.harness.autotune``): a random case under a drawn one, each bucket's case under every one.

* ``planted_tuned.rms_norm_tuned`` (correct under both of its configs) passes accuracy, contract
  and extremes, and its results say which configs the cases ran under;
* ``rms_norm_tuned_drops_tail`` (right under ``BLOCK=1024``, its small-block config drops each
  row's partial tail) is rejected on every seed, the message naming ``BLOCK=32``;
* its saved failure replays under that config, and a config the kernel does not have is refused;
* the certificate lists the configs and where they ran.
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

from ....impls import make  # noqa: E402
from ...evidence import certificate, replay  # noqa: E402
from ...run import runner
from ...search.case import Case  # noqa: E402
from ...families import BY_NAME, CASE_CHECKS  # noqa: E402
from ...harness.measure import PropertyFailure, Worst  # noqa: E402
from ...harness.sandbox import ContractViolation, invoke  # noqa: E402
from ...harness.session import Session  # noqa: E402

from . import planted_tuned, planted_tuned_layout  # noqa: E402

pytestmark = pytest.mark.normcert_heavy  # Triton kernels under the interpreter, config by config: the heavy tier

CONFIG_FAMILIES = ("accuracy", "contract", "extremes")  # where a block size shows: widths past and between
# blocks, one long row, many rows; the other forward families cost 29 s more under the interpreter
DTYPES = (torch.float32,)  # in the kernels' domain; the code path is the same in float16 and bfloat16 (cost:
# each bucket runs under every config, and a 32-wide block loops 512 times over a 16384-wide row)


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   eager=normcert_session.eager)


def _impl(fn):
    return make("rms_norm", fn.__name__, "plugin", fn, target=f"normcert.properties.tests.meta.planted_tuned:{fn.__name__}")


def _named(forcing, block: int) -> str:
    """The first of the kernel's configs with ``BLOCK=block``, by its name on this device: "BLOCK=32" under the
    interpreter, "BLOCK=32, num_warps=1, num_stages=3, num_ctas=1" on a GPU (``properties.harness.autotune.content``)."""
    return next(n for n in forcing.names if n.split(", ")[0] == f"BLOCK={block}")


def _configs(domain: str) -> set:
    """The configs a result's domain says its cases ran under."""
    return set(domain.split("autotuned configs: ")[1].split("; ")[0].split(" | "))


def test_a_correct_autotuned_kernel_is_certified_under_each_config(session):
    impl = _impl(planted_tuned.rms_norm_tuned)
    names = session.forcing(impl).names
    assert names == ("BLOCK=1024", "BLOCK=32") if session.device == "cpu" else len(names) == 3
    for family in CASE_CHECKS:
        if family.name not in CONFIG_FAMILIES:
            continue
        for dtype in DTYPES:
            res = runner.run_family(session, family, impl, dtype)
            assert res.outcome == "pass", res.message
            assert _configs(res.domain) == set(names), res.domain


def test_a_config_specific_bug_is_killed_naming_its_config_on_every_seed(session, request):
    """On each of ``--normcert-meta-seeds`` seeds (the issue's bar, 10 of 10, measured with
    ``--normcert-meta-seeds 10``)."""
    impl = _impl(planted_tuned.rms_norm_tuned_drops_tail)
    base = session.seed
    for k in range(request.config.getoption("--normcert-meta-seeds")):
        session.seed = base + 1000 * k
        with pytest.raises(PropertyFailure, match=r"(?s)accuracy fails .*config: BLOCK=32"):
            runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32)


def test_a_failure_under_a_pruned_config_names_the_config_that_ran(session):
    impl = _impl(planted_tuned.rms_norm_tuned_pruned_drops_tail)
    forcing = session.forcing(impl)
    big, small = _named(forcing, 1024), _named(forcing, 32)
    case = Case.sample("rms_norm", torch.float32, session.device, rows=2, width=33).under(big)  # 33 < 1024: pruned
    forcing.select(case.config)
    with pytest.raises(PropertyFailure):
        BY_NAME["accuracy"].check(session, impl, case, Worst())
    assert forcing.pruned == (big, small)
    with pytest.raises(PropertyFailure, match=r"(?s)config BLOCK=1024[^:]* is pruned away for this call's key: "
                                              r"it ran BLOCK=32.*config: BLOCK=1024"):
        runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32)


def test_an_autotuner_reached_through_a_module_attribute_is_forced_config_by_config(session):
    """``lib.kernel[grid](...)`` (``planted_tuned_layout``): the autotuner is found through the module
    attribute, so the kernel has its configs (not Triton's benchmarker on CPU, "0 active drivers"),
    and its small block's bug shows under that config."""
    fn = planted_tuned_layout.rms_norm_tuned_drops_tail
    impl = make("rms_norm", fn.__name__, "plugin", fn, target=f"{planted_tuned_layout.__name__}:{fn.__name__}")
    forcing = session.forcing(impl)
    assert len(forcing.names) == len(session.forcing(_impl(planted_tuned.rms_norm_tuned)).names) > 1
    case = Case.sample("rms_norm", torch.float32, session.device, rows=2, width=40).under(_named(forcing, 32))
    forcing.select(case.config)
    with pytest.raises(PropertyFailure):
        BY_NAME["accuracy"].check(session, impl, case, Worst())


def test_an_autotuner_not_found_is_said_to_be_so(session):
    """An autotuner reached in a way ``tuners`` cannot read (a name built in a string) runs Triton's
    benchmarker, which dies under the interpreter: the failure says that normcert did not find it."""
    if session.device != "cpu":
        pytest.skip("on a GPU an autotuner not found benchmarks and runs (its configs unforced)")
    fn = planted_tuned_layout.rms_norm_tuned_by_name
    impl = make("rms_norm", fn.__name__, "plugin", fn, target=f"{planted_tuned_layout.__name__}:{fn.__name__}")
    assert session.forcing(impl).names == ()
    with pytest.raises(ContractViolation, match=r"0 active drivers.*in Triton's autotuner benchmarking its configs: "
                                                r"the kernel reached an autotuner normcert did not find"):
        invoke(session, impl, Case.sample("rms_norm", torch.float32, session.device, rows=2, width=40))


def test_a_config_failure_replays_under_its_config(session, tmp_path):
    impl = _impl(planted_tuned.rms_norm_tuned_drops_tail)
    with pytest.raises(PropertyFailure):
        runner.run_family(session, BY_NAME["accuracy"], impl, torch.float32)
    saved = next(tmp_path.glob("*.npz"))
    meta, case = replay.load(str(saved), session.device)
    forcing = session.forcing(impl)
    assert meta["config"] == case.config == _named(forcing, 32)
    forcing.select(case.config)
    with pytest.raises(PropertyFailure):
        BY_NAME["accuracy"].check(session, impl, case, Worst())
    forcing.select(_named(forcing, 1024))
    BY_NAME["accuracy"].check(session, impl, case, Worst())  # the same case under the other config holds
    with pytest.raises(ValueError, match=f"config 'BLOCK=7' is not one of the kernel's: {re.escape('; '.join(forcing.names))}$"):
        forcing.select("BLOCK=7")


def test_the_certificate_lists_the_configs_and_where_they_ran(session):
    tuned, plain = _impl(planted_tuned.rms_norm_tuned), make("rms_norm", "eager", "eager", torch.nn.functional.rms_norm)
    listed = certificate._configs(session, tuned)
    assert listed["configs"] == list(session.forcing(tuned).names)
    assert ("interpreter" in listed["configs_ran_on"]) == (session.device == "cpu")
    assert certificate._configs(session, plain) == {"configs": [], "configs_ran_on": ""}
