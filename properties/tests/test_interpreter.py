"""Triton's interpreter, as normcert runs it on CPU (``normcert.properties.harness.interpreter``).

Pins each known gap between the interpreter and a GPU: on a bare interpreter
the probe kernel fails (so the correction is still needed, and the list in the
certificate is true), after ``install()`` it computes what a GPU computes, and
the run's session records the corrections it made.  The bfloat16 arithmetic of
the correction is also checked on its own against exact rational arithmetic,
and on a GPU (``--device cuda``) the probe kernels must give the references'
bits there too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from ..harness import interpreter, interpreter_bf16 as bf16, interpreter_types  # noqa: E402
from ...impls import OPS, registry  # noqa: E402
from ...oracle.formats import bits  # noqa: E402
from ..harness import probes  # noqa: E402
from ..run import runner, schedule
from ..families import BY_NAME  # noqa: E402

GAPS = ["float scalars", "libdevice", "bfloat16", "float8_e4m3fn", "int8", "tl.maximum with NaN"]

CHECK = """
import os, json
os.environ["TRITON_INTERPRET"] = "1"
from normcert.properties.harness import interpreter, interpreter_probes as p
probes = (p.float_probe, p.libdevice_probe, p.bfloat16_probe, p.float8_probe, p.int8_probe, p.maxnum_probe)
before = [interpreter._runs(f) for f in probes]
listed = p.bfloat16_mismatches() + p.float8_mismatches() + p.int8_mismatches() + p.maxnum_mismatches()
fp4 = p.fp4_mismatches()
made = interpreter.install()
after = [interpreter._runs(f) for f in probes]
print(json.dumps({"before": before, "listed": listed, "made": made, "after": after, "fp4": fp4,
                  "fp4_after": p.fp4_mismatches()}))
"""


@pytest.fixture(scope="module")
def fresh_interpreter():
    """install() in a fresh process (the corrections are process-wide): before, what it listed, after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_interpreters_gaps_and_their_corrections(fresh_interpreter):
    got = fresh_interpreter
    assert (got["before"], got["made"], got["after"]) == ([False] * 6, GAPS, [True] * 6)


def test_the_fp4_stores_need_no_correction(fresh_interpreter):
    """normcert's FP4 stores (E2M1 codes packed to uint8, UE8M0 exponent bytes) run on the bare
    interpreter as on a GPU, and still do with the corrections installed (so install() lists no
    "fp4 stores")."""
    assert (fresh_interpreter["fp4"], fresh_interpreter["fp4_after"]) == ([], [])


def test_the_bfloat16_probe_lists_each_defect(fresh_interpreter):
    """The defects of the issue, each named by the probe on a bare interpreter (Triton 3.7.1)."""
    listed = "\n".join(fresh_interpreter["listed"])
    for what in ("bf16 → fp32", "fp32 → bf16", "bf16 + bf16", "bf16 × bf16", "bf16 < bf16", "get_bf16",
                 "tl.dot(bf16, bf16)", "e4m3fn → fp32", "fp32 → e4m3fn", "fp32 → int8",
                 "tl.maximum: 3 of 5 differ", "tl.minimum: 3 of 5 differ"):
        assert what in listed, listed


def test_the_session_records_the_corrections(normcert_session):
    if not interpreter.active():
        assert normcert_session.interpreter is None
    else:
        assert normcert_session.interpreter == GAPS


def test_the_probe_kernels_on_the_device(normcert_session):
    """On a GPU the probe kernels must give the references' bits (the references are the GPU's truth)."""
    if normcert_session.device == "cpu":
        pytest.skip("runs with --device cuda")
    from ..harness import interpreter_probes  # noqa: PLC0415

    assert interpreter_probes.bfloat16_mismatches(normcert_session.device) == []
    assert interpreter_probes.float8_mismatches(normcert_session.device) == []
    assert interpreter_probes.int8_mismatches(normcert_session.device) == []
    assert interpreter_probes.maxnum_mismatches(normcert_session.device) == []
    assert interpreter_probes.fp4_mismatches(normcert_session.device) == []


def test_e4m3fn_encoding_is_torchs_cast():
    """The correction's fp8 rounding (``interpreter_fp8.encode``) gives torch's cast's bit patterns on
    the probe's rounding cases and on a million random float32 values across e4m3fn's range."""
    from ..harness import interpreter_fp8, interpreter_probes  # noqa: PLC0415

    rng = np.random.default_rng(0)
    random = np.ldexp(rng.random(10 ** 6) * 2 - 1, rng.integers(-14, 12, 10 ** 6)).astype(np.float32)
    for values in (interpreter_probes._e4m3_rounding_cases().numpy(), random):
        want = torch.from_numpy(values).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        got = interpreter_fp8.encode(values.astype(np.float64))
        same = (got == want) | (np.isnan(values) & ((got & 0x7F) == 0x7F))
        assert same.all(), values[~same][:5]


def _exact_bf16(q: Fraction) -> float:
    """q rounded to bfloat16, nearest even, from its exact rational value (subnormals and overflow included)."""
    if q == 0:
        return 0.0
    e = max(abs(q.numerator).bit_length() - abs(q.denominator).bit_length() + 1, -125)
    while abs(q) < Fraction(2) ** (e - 1) and e > -125:
        e -= 1
    while abs(q) >= Fraction(2) ** e:
        e += 1
    quantum = Fraction(2) ** (e - 8)  # 8 significant bits at exponent e - 1
    r = round(q / quantum) * quantum  # round() on a Fraction: ties to even
    return float(r) if abs(r) < 2 ** 128 else float("inf") if r > 0 else float("-inf")


def _values(bits: np.ndarray) -> list[float]:
    return bf16.widen(bits).astype(np.float64).tolist()


def test_rounding_from_float64_is_one_rounding():
    """float64 → bf16 through round-to-odd equals the exact rounding, also where rounding twice (via
    float32, nearest even) would not: a tie in bf16 that float32 creates."""
    rng = np.random.default_rng(1)
    top = rng.integers(0, 0x7F7F, 2000).astype(np.uint64) << np.uint64(48)
    tie = np.uint64(1) << np.uint64(47)
    near_ties = np.concatenate([top | tie | np.uint64(1), top | tie - np.uint64(1), top | tie,
                                top | (tie - np.uint64(1 << 28))]).view(np.float64)
    got = bf16.to_bf16(near_ties)
    want = [_exact_bf16(Fraction(v)) for v in near_ties.tolist()]
    assert _values(got) == want
    with np.errstate(over="ignore"):
        twice = bf16.to_bf16(near_ties.astype(np.float32))
    assert _values(twice) != want  # the cases are the ones a double rounding gets wrong


def test_fused_multiply_add_rounds_once():
    rng = np.random.default_rng(2)
    a, b, c = (rng.integers(0, 1 << 16, 4000, dtype=np.uint32).astype(np.uint16) for _ in range(3))
    with np.errstate(all="ignore"):  # signalling NaN patterns
        c[::2] = bf16.to_bf16(-(bf16.widen(a[::2]).astype(np.float64) * bf16.widen(b[::2])))  # cancellation
    finite = np.isfinite(bf16.widen(a)) & np.isfinite(bf16.widen(b)) & np.isfinite(bf16.widen(c))
    a, b, c = a[finite], b[finite], c[finite]
    got = _values(bf16.fma(a, b, c))
    want = [_exact_bf16(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(_values(a), _values(b), _values(c))]
    assert got == want


def test_reductions_round_every_step():
    """bf16 sums round every partial sum (ulp 2 at 256): a tree over [256, 1 x 7, 0 x 8] makes
    257 → 256 once and gives 262, a scan adds each 1 alone and stays at 256; the exact 263 would be 264."""
    v = bf16.to_bf16(np.array([256.0] + [1.0] * 7 + [0.0] * 8, dtype=np.float32))
    assert _values(bf16.tree_reduce(v, 0, False, np.add)) == 262.0
    assert _values(bf16.tree_reduce(v.reshape(2, 8), None, True, np.add)) == [[262.0]]
    assert _values(bf16.sequential_scan(v, 0, np.add))[:8] == [256.0] * 8


DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def test_a_kernel_under_the_interpreter_gets_the_scaled_many_rows_bucket(normcert_session):
    """The registry's Triton kernel launches interpreter programs, the eager one does not; the
    Triton kernel's many-rows bucket is scaled, its label (the certificate's domain) says so, and it
    runs in one dtype per run (``schedule.ROTATED_INTERPRETED``), the eager kernel's in every one."""
    if normcert_session.interpreter is None:
        pytest.skip("the kernels do not run under Triton's interpreter here")
    by = {i.backend: i for i in registry() if i.op == "rms_norm" and i.backend in ("eager", "triton")}
    f32 = torch.float32
    assert probes.runs_interpreted(normcert_session, by["triton"], f32)
    assert not probes.runs_interpreted(normcert_session, by["eager"], f32)
    many = {(i, d): [b for b in runner.scheduled(normcert_session, BY_NAME["accuracy"], by[i], d) if b.name == "many"]
            for i in by for d in DTYPES}
    assert all(len(many["eager", d]) == 1 and many["eager", d][0].rows == 65537 for d in DTYPES)
    ran = [d for d in DTYPES if many["triton", d]]
    assert ran == [getattr(torch, schedule.rotated(normcert_session, by["triton"], "accuracy", "many"))]
    assert many["triton", ran[0]][0].rows == 1025
    assert "scaled from 65537 rows: Triton's interpreter" in many["triton", ran[0]][0].label


def test_an_interpreted_kernel_s_batches_stop_at_the_many_bucket_s_rows(normcert_session):
    """Batch invariance recomputes a narrow case in batches of 1, 2, 3, 300 and 4100 rows; under the
    interpreter none past the "many" bucket's 1025 (4100 programs of a row-per-program kernel were
    four fifths of an interpreted certify's batch invariance), and the certificate's domain says so."""
    if normcert_session.interpreter is None:
        pytest.skip("the kernels do not run under Triton's interpreter here")
    from hypothesis import find  # noqa: PLC0415

    from ..families import bitwise  # noqa: PLC0415

    by = {i.backend: i for i in registry() if i.op == "rms_norm" and i.backend in ("eager", "triton")}
    narrow = find(bitwise.batch_cases("rms_norm", torch.float32, normcert_session.device),
                  lambda c: c.main.shape[-1] <= 7)
    sizes = {}
    for backend, impl in by.items():
        case = narrow.copy()
        bitwise.check_batch_invariance(normcert_session, impl, case, None)
        coverage = runner.Coverage()
        coverage.checked(case)
        sizes[backend] = (case.notes["batch sizes"], coverage.domain)
    assert sizes["eager"][0] == "1/2/3/300/4100" and "interpreter" not in sizes["eager"][1]
    assert sizes["triton"][0] == "1/2/3/300"
    assert "batch sizes: 1, 2, 3, 300 (none past 1025 rows: Triton's interpreter)" in sizes["triton"][1]


HELPERS = '''
import triton.language as tl
from triton.language.extra.libdevice import rint

@{jit}
def round_half(v):
    return rint(v * 0.5)
'''
CORE_HELPER = '''
import triton
import triton.language.core as core

@triton.jit
def plus_one(v):
    return core.maximum(v, v) + 1.0
'''
KERNEL = '''
import triton
import triton.language as tl
from helpers import round_half
from core_helper import plus_one

@triton.jit
def kernel(X, Y, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, plus_one(round_half(tl.load(X + i))))
'''
ONCE = """
import os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import torch
from triton.runtime import interpreter as triton_interpreter
from normcert.properties.harness import interpreter
patches = []
original = triton_interpreter._patch_lang
def counted(fn):
    patches.append(fn.__name__)
    return original(fn)
triton_interpreter._patch_lang = counted
interpreter.install()
patches.clear()  # the probes' launches
import helpers, kernel
stub = helpers.rint
x = torch.arange(32, dtype=torch.float32) - 9.0
y = torch.empty_like(x)
kernel.kernel[(4,)](x, y, BLOCK=8)
first = list(patches)
y2 = torch.empty_like(x)
kernel.kernel[(4,)](x, y2, BLOCK=8)
print(json.dumps({"patches": first, "again": patches[len(first):], "y": y.tolist(), "y2": y2.tolist(),
                  "want": (torch.round(x * 0.5) + 1).tolist(), "restored": helpers.rint is stub}))
"""


def test_the_language_is_bound_once_and_the_helpers_stay_correct(tmp_path):
    """Triton's interpreter rebinds the language at every launch and helper call; after ``install()``
    each language module is bound once for the process (the launch's ``triton.language``, then the
    ``triton.language.core`` a helper's module imports on its own; a second launch binds nothing), a
    helper's libdevice name is still corrected, the outputs are right, and each launch's end
    restores the helper's globals."""
    (tmp_path / "helpers.py").write_text(HELPERS.format(jit="triton.jit").replace("import triton.language",
                                                                                   "import triton\nimport triton.language"))
    (tmp_path / "core_helper.py").write_text(CORE_HELPER)
    (tmp_path / "kernel.py").write_text(KERNEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    out = subprocess.run([sys.executable, "-c", ONCE, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["y"] == got["want"] == got["y2"] and got["restored"]
    # the launch's module once, then plus_one's (it sees triton.language.core) once; round_half
    # never; a second launch binds nothing
    assert got["patches"] == ["kernel", "plus_one"] and got["again"] == []


def test_the_kept_numpy_types_are_the_interpreter_s_own():
    """``_np_dtypes_once`` keeps ``_get_np_dtype``'s answers: the same numpy type as Triton's own for
    every element type, pointer and block of them."""
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    from ..harness import interpreter

    interpreter._np_dtypes_once()
    kept = triton_interpreter._get_np_dtype
    assert kept.normcert_kept is not None
    types = [tl.int1, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.int32,
             tl.uint32, tl.int64, tl.uint64, tl.float8e5, tl.float8e4nv, tl.pointer_type(tl.float32)]
    for ty in types + [tl.block_type(t, [4]) for t in types]:
        assert kept(ty) == kept(ty) == kept.normcert_built(ty), ty


def test_the_kept_block_types_are_shared_and_equal_to_triton_s_own():
    """``interpreter_types`` hands out one block type per (element type, shape), equal to the one
    Triton builds; a block of pointers (no hash) is built afresh; a tensor's shape is made once per
    type and equals itself."""
    import triton.language as tl

    interpreter_types.install()
    block = tl.block_type(tl.float32, [4, 2])
    half = block.with_element_ty(tl.float16)
    assert half is block.with_element_ty(tl.float16)
    assert half == tl.block_type.with_element_ty.normcert_built(block, tl.float16) and half.shape == (4, 2)
    pointers = block.with_element_ty(tl.pointer_type(tl.float32))
    assert pointers is not block.with_element_ty(tl.pointer_type(tl.float32))
    assert pointers == tl.block_type(tl.pointer_type(tl.float32), [4, 2])
    a, b = tl.tensor(None, half), tl.tensor(None, half)
    assert a.shape is b.shape and bool(a.shape == b.shape) and int(a.numel) == 8
    assert [int(s) for s in a.shape] == [4, 2] and a.dtype == tl.float16
    assert tl.tensor(None, tl.float32).shape == tl.tuple([]) and int(tl.tensor(None, tl.float32).numel) == 1


@pytest.mark.parametrize("op", ["rms_norm", "swiglu", "rms_norm_group_quant", "rms_norm_fp4_quant"])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_the_kept_types_give_the_bits_triton_s_own_give(op, in_dtype):
    """A registry Triton kernel under the interpreter gives the same bits with the block types and
    shapes kept (``interpreter_types``) as with Triton's own functions."""
    if not interpreter.active():
        pytest.skip("a GPU: no interpreter")
    interpreter.install()
    impl = next(i for i in registry() if i.op == op and i.backend == "triton")
    rec = OPS[op]
    torch.manual_seed(0)
    a = rec.sample(in_dtype, "cpu", rows=5, width=96 if rec.halves else 48)
    outs = []
    try:
        for types in (interpreter_types.uninstall, interpreter_types.install):
            types()
            with torch.no_grad():
                outs.append(rec.call_outputs(impl.fn, a))
    finally:
        interpreter_types.install()
    assert all(torch.equal(bits(x), bits(y)) for x, y in zip(*outs))
