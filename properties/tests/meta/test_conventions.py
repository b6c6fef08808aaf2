"""Calling conventions (``normcert.properties.declared.conventions``): kernels that write into caller buffers.

Correct kernels in each convention are certified; a kernel that leaves part of
``out`` unwritten, returns what its convention does not, writes an input its
convention does not mutate, or forgets one of its in-place outputs is rejected
with a message that says so; the storage around every view normcert hands over
holds ``POISON``, not zeros, so that a write around a view changes bits; a
declared convention that cannot fit the op is a usage error; a replay file keeps
the convention.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import Phase, find, settings

from .... import impls
from ...declared import conventions
from ....oracle.formats import bits
from ...run import runner
from ...harness.measure import PropertyFailure
from ...search import strategies
from ...search import fitting
from ...families import BY_NAME
from ...harness.session import Session

from . import planted

PLANTED = "normcert.properties.tests.meta.planted"


def _plug(op, fn, convention):
    return impls.plugin(f"{op}={PLANTED}:{fn.__name__}@{convention}")


@pytest.fixture
def session(normcert_session, tmp_path):
    return Session(device=normcert_session.device, seed=normcert_session.seed, failures_dir=str(tmp_path),
                   eager=normcert_session.eager)


def _run(session, family, impl, dtype):
    return runner.run_family(session, BY_NAME[family], impl, dtype)


@pytest.mark.parametrize("op, fn, convention", [
    ("rms_norm", planted.rms_out, "out"),
    ("rms_norm", planted.rms_outkw, "outkw"),
    ("add_rms_norm", planted.add_rms_inplace, "inplace"),
    ("silu_and_mul", planted.silu_and_mul_out, "out"),
    ("rms_norm_fp8", planted.rms_fp8_out, "out"),
])
@pytest.mark.parametrize("family", ["accuracy", "contract"])
def test_correct_kernels_in_each_convention_are_certified(session, op, fn, convention, family):
    impl = _plug(op, fn, convention)
    assert impl.convention == convention and impl.target.endswith(f"@{convention}")
    for dtype in (torch.float32, torch.bfloat16):
        assert _run(session, family, impl, dtype).outcome == "pass"


@pytest.mark.parametrize("op, fn, convention, message, fmt", [
    ("rms_norm", planted.rms_out_skips_last_column, "out", r"@out: \d+ of \d+ elements of y were never written",
     torch.float32),
    ("rms_norm", planted.rms_out_returns_out, "out", "@out: returned Tensor, expected None", torch.float32),
    ("rms_norm", planted.rms_out, "outkw", r"raised TypeError: rms_out\(\) got multiple values for argument 'out'",
     torch.float32),
    ("rms_norm", planted.rms_outkw_ignores_out, "outkw", "@outkw: returned Tensor, expected None or out itself",
     torch.float32),
    ("add_rms_norm", planted.add_rms_inplace_scales_weight, "inplace", "mutated its input 'weight'", torch.float32),
    ("add_rms_norm", planted.add_rms_inplace_stale_residual, "inplace", "residual_out", torch.float32),
    ("add_rms_norm", planted.add_rms_inplace_truncated_residual, "inplace", r"residual_out\[\d+\]: got .* bound 0",
     torch.bfloat16),
])
def test_broken_conventions_are_rejected(session, op, fn, convention, message, fmt):
    with pytest.raises(PropertyFailure, match=message):
        _run(session, "accuracy", _plug(op, fn, convention), fmt)


def test_unwritten_elements_are_told_from_computed_nans():
    """The poison is a NaN no arithmetic makes: a kernel's own NaN is not 'never written'."""
    for dtype in conventions.POISON:
        buf = conventions.poisoned((3,), dtype, "cpu")
        assert conventions.unwritten(buf) == 3 and torch.isnan(buf).all()
        buf[0] = float("nan")
        buf[1] = torch.tensor(0.0, dtype=dtype).log().neg().mul(0)  # inf * 0: a computed NaN
        assert conventions.unwritten(buf) == 1


def _around(t: torch.Tensor) -> torch.Tensor:
    """The bits of t's storage outside its view."""
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
    inside = torch.zeros(flat.numel(), dtype=torch.bool)
    torch.empty(0, dtype=torch.bool).set_(inside.untyped_storage(), t.storage_offset(), t.shape, t.stride()).fill_(True)
    return bits(flat[~inside])


def test_the_storage_around_every_view_normcert_makes_is_poison():
    """Layouts drawn (sliced, fused QKV, offset; a strided weight), made by fitting, and the large
    family's far rows: around the view, every element holds the dtype's POISON."""
    rng = np.random.default_rng(0)
    views = [strategies.layout_tensor(rng.standard_normal((3, 4, 8)), dtype, layout, "cpu")
             for dtype in conventions.POISON for layout in ("sliced", "fused_qkv", "offset")]
    weight = strategies.vectors(rng, 8, torch.bfloat16, "cpu", "weight", 1.0, ("normal",))
    views.append(find(weight, lambda w: not w.is_contiguous(), settings=settings(database=None, phases=[Phase.generate])))
    views += [fitting.relayout(torch.ones(3, 8), views[0]), fitting.relayout(torch.ones(8), views[-1])]
    views.append(strategies.device_normal((3, 8), torch.float16, "cpu", seed=0, stride=20))
    for v in views:
        around = _around(v)
        assert around.numel() and (around == _signed_poison(v.dtype)).all(), (v.dtype, v.stride())


def _signed_poison(dtype) -> int:
    return conventions._signed(conventions.POISON[dtype], torch.finfo(dtype).bits)


@pytest.mark.parametrize("spec, message", [
    (f"rms_norm={PLANTED}:rms_out@sideways", "convention 'sideways'.*expected one of inplace, out, outkw"),
    (f"silu_and_mul={PLANTED}:silu_and_mul_out@inplace", "@inplace: silu_and_mul's outputs"),
    (f"rms_norm_fp8={PLANTED}:rms_fp8_out@inplace", "@inplace: rms_norm_fp8's y has a dtype of its own"),
])
def test_a_convention_that_cannot_apply_is_a_usage_error(spec, message):
    with pytest.raises(impls.UsageError, match=message):
        impls.plugin(spec)


@pytest.mark.normcert_heavy  # the command end to end in a fresh process: the heavy tier
def test_a_replay_file_keeps_the_convention(session, tmp_path):
    impl = _plug("rms_norm", planted.rms_out_skips_last_column, "out")
    with pytest.raises(PropertyFailure):
        _run(session, "accuracy", impl, torch.float32)
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path) if f.endswith(".npz")]
    meta = np.load(path, allow_pickle=False)["meta"].tobytes().decode()
    assert f'"impl": "rms_norm={PLANTED}:rms_out_skips_last_column@out"' in meta
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    out = subprocess.run([sys.executable, "-m", "normcert", "replay", path], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "elements of y were never written" in out.stdout, out.stdout[-3000:]
