"""The probe kernels of ``interpreter`` (imported only where Triton is).

``float_probe`` and ``libdevice_probe`` each compute 0.5 on a GPU.
``bfloat16_mismatches`` runs small kernels over bfloat16's whole domain and
compares their bits with exact references (torch's CPU conversions and
arithmetic, which round once to nearest even):

* bf16 → fp32 on all 65,536 patterns;
* fp32 → bf16 on 6 values per bf16 pattern b: b itself, b + 1 fp32 ulp, the
  midpoint above b (a tie), the tie ± 1 ulp, and the largest value below the
  next pattern; this covers ties to even, carries into the exponent, every
  subnormal, overflow to inf, inf and NaN;
* +, −, ×, <, max on 3 · 2¹⁴ pairs: random patterns, pairs with close exponents
  (where rounding happens), and pairs of zeros, subnormals and infinities;
* a bf16 constant, ``tl.sum`` and ``tl.max`` of negative values, ``tl.dot``.

``float8_mismatches`` does the same for float8_e4m3fn (``tl.float8e4nv``): e4m3fn → fp32 on
all 256 patterns, and fp32 → e4m3fn on each finite value, the midpoint above it (a tie), the
tie ± 1 fp32 ulp, the largest fp32 below the next value, and past 448, ±inf and NaN (torch's
cast: nearest even, saturating, as a GPU's ``cvt.rn.satfinite``).

NaN results must be NaN; their payload is not compared; max(+0, -0) may be
either zero (IEEE 754-2008's maxNum leaves its sign open).  The same kernels run
on a GPU (``device="cuda"``), where they must agree bit for bit as well.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra.libdevice import rsqrt, tanh

from ...oracle.formats import E2M1, UE8M0, bits
from ...impls.triton_fp4 import e2m1_codes, ue8m0


@triton.jit
def float_scalar(out, eps):
    tl.store(out, eps.to(tl.float32) * 2)


@triton.jit
def libdevice_rsqrt_tanh(out, x):
    v = tl.load(x)
    tl.store(out, rsqrt(v) + tanh(v - 4.0))


def float_probe() -> bool:
    out = torch.zeros(1)
    float_scalar[(1,)](out, 0.25)
    return out.item() == 0.5


def libdevice_probe() -> bool:
    out, x = torch.zeros(1), torch.full((1,), 4.0)
    libdevice_rsqrt_tanh[(1,)](out, x)
    return out.item() == 0.5


BLOCK = 1 << 14


@triton.jit
def _convert(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n).to(dst.dtype.element_ty), mask=i < n)


@triton.jit
def _arithmetic(a, b, add, sub, mul, less, big, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x, y = tl.load(a + i, mask=m), tl.load(b + i, mask=m)
    tl.store(add + i, x + y, mask=m)
    tl.store(sub + i, x - y, mask=m)
    tl.store(mul + i, x * y, mask=m)
    tl.store(less + i, (x < y).to(tl.int8), mask=m)
    tl.store(big + i, tl.maximum(x, y), mask=m)


@triton.jit
def _constant_sum_max(x, const, total, top, N: tl.constexpr):
    v = tl.load(x + tl.arange(0, N))
    tl.store(const + tl.arange(0, N), v * 1.5 + tl.full((N,), 1.0048828125, tl.bfloat16))
    tl.store(total, tl.sum(v, 0))
    tl.store(top, tl.max(v, 0))


@triton.jit
def _dot(a, b, c, N: tl.constexpr):
    r = tl.arange(0, N)
    tile = r[:, None] * N + r[None, :]
    tl.store(c + tile, tl.dot(tl.load(a + tile), tl.load(b + tile)))


def _launch(kernel, n, *args):
    kernel[(triton.cdiv(n, BLOCK),)](*args, n, BLOCK=BLOCK)


def _patterns() -> torch.Tensor:
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def _rounding_cases() -> torch.Tensor:
    top = _patterns().view(torch.int16).to(torch.int32) << 16
    low = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int32)
    return (top[:, None] | low[None, :]).reshape(-1).view(torch.float32)


def _pairs() -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(0)
    n = BLOCK
    a = rng.integers(0, 1 << 16, 3 * n, dtype=np.uint32)
    b = rng.integers(0, 1 << 16, 3 * n, dtype=np.uint32)
    b[n:2 * n] = (a[n:2 * n] & 0xFF80) ^ (rng.integers(0, 3, n, dtype=np.uint32) << 7) | (b[n:2 * n] & 0x7F)
    specials = np.array([0, 0x8000, 1, 0x8001, 0x7F, 0x80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80], dtype=np.uint32)
    a[2 * n:] = rng.choice(specials, n)
    b[2 * n:] = rng.choice(specials, n)
    as_bf16 = (lambda v: torch.from_numpy(v.astype(np.uint16).view(np.int16)).view(torch.bfloat16))
    return as_bf16(a), as_bf16(b)


def _differ(what: str, label, got: torch.Tensor, want: torch.Tensor) -> list[str]:
    """[] if got and want agree bit for bit (NaN with any NaN), else one line naming the first input
    ``label(k)`` that differs."""
    bad = (bits(got) != bits(want)) & ~(got.isnan() & want.isnan())
    if not bad.any():
        return []
    k = int(bad.nonzero()[0, 0])
    return [f"{what}: {int(bad.sum())} of {bad.numel()} differ, e.g. {label(k)} gives "
            f"{got[k].item()!r}, a GPU gives {want[k].item()!r}"]


def _check(what: str, run) -> list[str]:
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - an interpreter that cannot run the kernel fails the check
        return [f"{what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]


def bfloat16_mismatches(device: str = "cpu") -> list[str]:
    """One line per way the bf16 kernels above differ from a GPU's bits on ``device`` (empty: none)."""

    def widening():
        src = _patterns()
        out = torch.empty(src.shape, dtype=torch.float32, device=device)
        _launch(_convert, src.numel(), src.to(device), out)
        return _differ("bf16 → fp32", lambda k: f"pattern {src[k:k + 1].view(torch.int16).item() & 0xFFFF:#06x}",
                       out.cpu(), src.float())

    def rounding():
        src = _rounding_cases()
        out = torch.empty(src.shape, dtype=torch.bfloat16, device=device)
        _launch(_convert, src.numel(), src.to(device), out)
        return _differ("fp32 → bf16", lambda k: repr(src[k].item()), out.cpu(), src.to(torch.bfloat16))

    def arithmetic():
        a, b = _pairs()
        outs = [torch.empty(a.shape, dtype=d, device=device) for d in (torch.bfloat16,) * 3 + (torch.int8,)]
        outs.append(torch.empty(a.shape, dtype=torch.bfloat16, device=device))
        _launch(_arithmetic, a.numel(), a.to(device), b.to(device), *outs)
        # max: NaN operands aside, and either zero for max(+0, -0), whose sign IEEE 754-2008's maxNum
        # leaves open (an H100 returns the second operand, torch.maximum on the CPU +0)
        got_max = outs[4].cpu()
        open_ = a.isnan() | b.isnan() | ((a == 0) & (b == 0) & (got_max == 0))
        want = [a + b, a - b, a * b, (a < b).to(torch.int8), torch.where(open_, got_max, torch.maximum(a, b))]
        labels = (lambda k: f"({a[k].item()!r}, {b[k].item()!r})")
        return [line for name, got, ref in zip(("+", "−", "×", "<", "max"), outs, want)
                for line in _differ(f"bf16 {name} bf16", labels, got.cpu(), ref)]

    def reductions():
        n = 128
        v = torch.tensor([(-1) ** i * (1 + i % 3) for i in range(n)], dtype=torch.bfloat16) - 2
        const = torch.empty(n, dtype=torch.bfloat16, device=device)
        total, top = (torch.empty(1, dtype=torch.bfloat16, device=device) for _ in range(2))
        _constant_sum_max[(1,)](v.to(device), const, total, top, N=n)
        want_const = (v * 1.5) + torch.tensor(1.0048828125).to(torch.bfloat16)
        return (_differ("bf16 × 1.5 + tl.full(1.0048828125)", lambda k: f"x = {v[k].item()!r}", const.cpu(), want_const)
                + _differ("tl.sum(bf16)", lambda k: "128 values", total.cpu(), v.sum().reshape(1))
                + _differ("tl.max(bf16 < 0)", lambda k: "128 values", top.cpu(), v.max().reshape(1)))

    def dot():
        n = 16
        a = (torch.arange(n * n) % 7 - 3).to(torch.bfloat16).reshape(n, n)
        b = (torch.arange(n * n) % 5 - 2).to(torch.bfloat16).reshape(n, n)
        c = torch.empty(n, n, device=device)
        _dot[(1,)](a.to(device), b.to(device), c, N=n)
        want = (a.float() @ b.float()).reshape(-1)
        return _differ("tl.dot(bf16, bf16)", lambda k: f"element {k}", c.cpu().reshape(-1), want)

    return [line for what, run in (("bf16 → fp32", widening), ("fp32 → bf16", rounding),
                                   ("bf16 arithmetic", arithmetic), ("bf16 constants and reductions", reductions),
                                   ("tl.dot(bf16)", dot))
            for line in _check(what, run)]


def bfloat16_probe() -> bool:
    return not bfloat16_mismatches()


def _e4m3_rounding_cases() -> torch.Tensor:
    values = torch.arange(0, 0x7F, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    above = torch.cat([values[1:], torch.tensor([480.0])])  # 480: where the next value would be
    mid = (values + above) / 2  # exact in fp32
    inf = torch.tensor(float("inf"))
    cases = torch.cat([values, mid, torch.nextafter(mid, inf), torch.nextafter(mid, -inf), torch.nextafter(above, -inf),
                       torch.tensor([1e30, float("inf"), float("nan")])])
    return torch.cat([cases, -cases])


def float8_mismatches(device: str = "cpu") -> list[str]:
    """One line per way the e4m3fn conversions differ from a GPU's bits on ``device`` (empty: none)."""

    def widening():
        src = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
        out = torch.empty(src.shape, dtype=torch.float32, device=device)
        _launch(_convert, src.numel(), src.to(device), out)
        return _differ("e4m3fn → fp32", lambda k: f"pattern {k:#04x}", out.cpu(), src.float())

    def rounding():
        src = _e4m3_rounding_cases()
        out = torch.empty(src.shape, dtype=torch.float8_e4m3fn, device=device)
        _launch(_convert, src.numel(), src.to(device), out)
        got, want = out.cpu(), src.to(torch.float8_e4m3fn)
        return _differ("fp32 → e4m3fn", lambda k: repr(src[k].item()), got.float(), want.float())

    return [line for what, run in (("e4m3fn → fp32", widening), ("fp32 → e4m3fn", rounding))
            for line in _check(what, run)]


def float8_probe() -> bool:
    return not float8_mismatches()


INT8_CASES = (0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.9, 127.0, 127.5, 128.0, 200.0, 1e30, float("inf"), -127.9, -128.0,
              -128.5, -129.0, -300.0, -1e30, float("-inf"), float("nan"))


def int8_mismatches(device: str = "cpu") -> list[str]:
    """One line per way the fp32 -> int8 conversion differs from a GPU's (``cvt.rzi.s8.f32``:
    toward zero, saturating to [-128, 127], NaN to 0) on ``device`` (empty: none)."""

    def converting():
        src = torch.tensor(INT8_CASES, dtype=torch.float32)
        out = torch.empty(src.shape, dtype=torch.int8, device=device)
        with np.errstate(invalid="ignore"):  # numpy's cast of NaN and inf, on a bare interpreter: quietly
            _launch(_convert, src.numel(), src.to(device), out)
        v = src.double().numpy()
        want = torch.from_numpy(np.where(np.isnan(v), 0, np.clip(np.trunc(v), -128, 127)).astype(np.int8))
        return _differ("fp32 → int8", lambda k: repr(src[k].item()), out.cpu(), want)

    return _check("fp32 → int8", converting)


def int8_probe() -> bool:
    return not int8_mismatches()


@triton.jit
def _max_min_nan(a, b, out, n, BLOCK: tl.constexpr):
    """tl.maximum / tl.minimum of a and b: by default (maxNum / minNum, NaN dropped) and with
    propagate_nan=ALL (NaN kept), in four rows of out."""
    i = tl.arange(0, BLOCK)
    m = i < n
    x, y = tl.load(a + i, mask=m), tl.load(b + i, mask=m)
    tl.store(out + i, tl.maximum(x, y), mask=m)
    tl.store(out + n + i, tl.minimum(x, y), mask=m)
    tl.store(out + 2 * n + i, tl.maximum(x, y, propagate_nan=tl.PropagateNan.ALL), mask=m)
    tl.store(out + 3 * n + i, tl.minimum(x, y, propagate_nan=tl.PropagateNan.ALL), mask=m)


MAXNUM_PAIRS = ((float("nan"), 1e-10), (2.0, float("nan")), (float("nan"), float("nan")), (3.0, -1.0),
                (float("nan"), float("-inf")))


def maxnum_mismatches(device: str = "cpu") -> list[str]:
    """One line per way tl.maximum / tl.minimum differ from a GPU's on a NaN operand (empty: none):
    by default they are IEEE 754-2008 maxNum / minNum (``max.f32``: the other operand where one is
    NaN, NaN where both are), with propagate_nan=ALL NaN wherever an operand is (``max.NaN.f32``)."""

    def comparing():
        a = torch.tensor([p[0] for p in MAXNUM_PAIRS], dtype=torch.float32)
        b = torch.tensor([p[1] for p in MAXNUM_PAIRS], dtype=torch.float32)
        out = torch.empty(4 * a.numel(), dtype=torch.float32, device=device)
        with np.errstate(invalid="ignore"):
            _max_min_nan[(1,)](a.to(device), b.to(device), out, a.numel(), BLOCK=8)
        got = out.cpu().reshape(4, -1)
        wants = (torch.fmax(a, b), torch.fmin(a, b), torch.maximum(a, b), torch.minimum(a, b))
        return [line for k, (what, want) in enumerate(zip(("tl.maximum", "tl.minimum", "tl.maximum(ALL)",
                                                           "tl.minimum(ALL)"), wants))
                for line in _differ(what, lambda j: f"{a[j].item()!r}, {b[j].item()!r}", got[k], want)]

    return _check("tl.maximum with NaN", comparing)


def maxnum_probe() -> bool:
    return not maxnum_mismatches()


@triton.jit
def _fp4_codes_bytes(src, packed, exponents, n, BLOCK: tl.constexpr):
    """normcert's FP4 kernels' own stores (``triton_fp4``): the E2M1 codes of src's pairs packed
    into uint8 (element 2j low), and each src value's UE8M0 exponent byte."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = j < n
    low, high = tl.load(src + 2 * j, mask=m, other=0.0), tl.load(src + 2 * j + 1, mask=m, other=0.0)
    tl.store(packed + j, (e2m1_codes(low) | (e2m1_codes(high) << 4)).to(tl.uint8), mask=m)
    _, byte_low = ue8m0(tl.abs(low))
    _, byte_high = ue8m0(tl.abs(high))
    tl.store(exponents + 2 * j, byte_low, mask=m)
    tl.store(exponents + 2 * j + 1, byte_high, mask=m)


def _fp4_cases() -> torch.Tensor:
    """Each E2M1 value, the midpoints between them (ties) and 1 float32 ulp either side, past 6
    and inf, as +-; the UE8M0 cases: powers of two from 2**-149 to 2**127 and 1 ulp either side,
    the largest float32, and NaN (an even count: the pairs)."""
    inf = torch.tensor(float("inf"))
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0])
    mid = (grid[1:] + grid[:-1]) / 2
    powers = torch.ldexp(torch.ones(277), torch.arange(-149, 128))
    cases = torch.cat([grid, mid, torch.nextafter(mid, inf), torch.nextafter(mid, -inf), powers,
                       torch.nextafter(powers, inf), torch.nextafter(powers, -inf),
                       torch.tensor([3.4028235e38, 7.0, 1e30]), inf.reshape(1)])
    cases = torch.cat([cases, -cases, torch.tensor([float("nan"), -float("nan")])])
    return cases if len(cases) % 2 == 0 else torch.cat([cases, torch.zeros(1)])


def fp4_mismatches(device: str = "cpu") -> list[str]:
    """One line per way normcert's FP4 stores (``triton_fp4``: E2M1 codes by comparisons packed to
    uint8, element 2j in the low nibble; UE8M0 rounded up on float32 bits, stored as the exponent
    byte) differ from what a GPU stores on ``device`` (empty: none).  The GPU's truth: E2M1's
    nearest even saturating rounding, the sign bit in bit 3 (a NaN: code 0 with its sign, no
    comparison holding), and 2**ceil(log2 |v|) clamped to [2**-127, 2**127] as byte log2 + 127
    (0xFF for NaN)."""

    def storing():
        src = _fp4_cases()
        packed = torch.empty(len(src) // 2, dtype=torch.uint8, device=device)
        exponents = torch.empty(len(src), dtype=torch.uint8, device=device)
        _launch(_fp4_codes_bytes, len(src) // 2, src.to(device), packed, exponents)
        v = src.double().numpy()
        y = np.where(np.isnan(v), 0.0, E2M1.round(v))
        codes = np.searchsorted(np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]), np.abs(y))
        codes = codes | np.where(np.signbit(v), 8, 0)
        want_packed = torch.from_numpy((codes[0::2] | codes[1::2] << 4).astype(np.uint8))
        s = UE8M0.round(np.abs(v))
        want_bytes = torch.from_numpy(np.where(np.isnan(s), 255, np.log2(np.where(np.isnan(s), 1.0, s)) + 127)
                                      .astype(np.uint8))
        pairs = (lambda k: f"({src[2 * k].item()!r}, {src[2 * k + 1].item()!r})")
        return (_differ("E2M1 codes packed to uint8", pairs, packed.cpu().to(torch.int32), want_packed.to(torch.int32))
                + _differ("UE8M0 exponent byte", lambda k: repr(src[k].item()), exponents.cpu().to(torch.int32),
                          want_bytes.to(torch.int32)))

    return _check("fp4 stores", storing)


def fp4_probe() -> bool:
    return not fp4_mismatches()
