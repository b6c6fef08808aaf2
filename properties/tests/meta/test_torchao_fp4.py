"""torchao 0.18's FP4 quantisers as the test subject (``examples/real_kernels/torchao_fp4.py``): each
MX scale mode (FLOOR, CEIL, EVEN, RCEIL) with its NVFP4 path is certified under the rules it declares
(``mx_scale=``, ``block_floor=2^-6``) and rejected without them, after normcert's eager rms_norm.
Heavy tier; skipped where torchao is not installed (it is no dependency of normcert)."""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import pytest
import torch

from ....impls import make
from ...declared.domain import parse
from ...families import BY_NAME
from ...harness.measure import PropertyFailure
from ...harness.session import Session
from ...run import runner

pytest.importorskip("torchao", reason="torchao is not installed: pip install torchao==0.18.0 to run its adapters")

EXAMPLE = pathlib.Path(__file__).parents[3] / "examples" / "real_kernels" / "torchao_fp4.py"
MODES = ("floor", "ceil", "even", "rceil")
FAMILIES = ("contract", "accuracy", "extremes")


def _adapters():
    spec = importlib.util.spec_from_file_location("torchao_fp4", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _impl(op, fn, domain=None):
    impl = make(op, fn.__name__, "plugin", fn, target=f"torchao_fp4:{fn.__name__}")
    return impl if domain is None else dataclasses.replace(impl, domain=parse(domain))


@pytest.mark.normcert_heavy
@pytest.mark.parametrize("mode", MODES)
def test_each_torchao_mode_is_judged_by_its_declaration(tmp_path, mode):
    """After rms_norm: certified declared, rejected on the scales undeclared.  (After silu_and_mul
    the extremes family rejects torchao declared: ``docs/explanation/findings.md``.)"""
    op = "rms_norm_fp4_quant"
    fn = getattr(_adapters(), f"rms_norm_fp4_{mode}")
    declared = _impl(op, fn)
    assert ("mx_scale=" + mode in declared.domain.describe()) == (mode != "rceil")
    assert "block_floor=2^-6" in declared.domain.describe()
    session = Session(failures_dir=str(tmp_path))
    for family in FAMILIES:
        for dtype in (torch.float32, torch.bfloat16):
            res = runner.run_family(session, BY_NAME[family], declared, dtype, max_examples=15)
            assert res.outcome == "pass", (dtype, family, res.message)
    undeclared = _impl(op, fn, "dtypes=float32,float16,bfloat16")
    with pytest.raises(PropertyFailure, match=r"scales"):  # extremes: an all-zero row's NVFP4 scale, 2**-6 not 0
        for family in ("accuracy", "extremes"):
            runner.run_family(session, BY_NAME[family], undeclared, torch.float32, max_examples=20, shrink=False)
