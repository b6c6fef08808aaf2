"""The suite's Hypothesis strategies: shapes, values, masks, and ``cases`` of any op.

``cases`` draws every argument of an op by its kind (``oracle.record``); the
property families narrow it (profiles, hostile rows, row counts) in their own
``*_cases`` functions, which compose these.

A case is drawn as a handful of *structural* choices -- shape, layout, value
profile per tensor, eps, mask kind, which rows are hostile -- plus one integer
seed from which a numpy generator fills the values.  Hypothesis shrinks the
structure (smaller shapes, plainer profiles, seed 0), generation stays fast
for 8192-wide rows, and a shrunk example is reproducible from its choices.

Values are drawn on the dtype's own bit lattice: sign, exponent and significand
bits are chosen directly (subnormals included), then assembled exactly in
float64, so every value is representable and nothing is "cast from fp32".

Profiles (``x`` and friends):
    normal     Gaussian * 10**U(-4, 4), rounded to the dtype (nearest-even)
    lattice    random bit patterns, exponents in an 8-binade window
    offset     |mean| = std * 10**U(3, 6): the rows one-pass variance breaks on
    constant   every row constant (its own value)
    zeros      all zero
    near_max   top 3 binades of the dtype (x**2 overflows unless widened)
    subnormal  the dtype's subnormals and smallest normals
    wide       exponents over the dtype's whole range
    tiny_scale  (buckets only) rows alternately of +-(1 + U(0, 0.2)) 2**-62 (float16: its least
               subnormal) and of exponents in [-4, -3]: an FP4 activation's blocks at UE8M0's least scale and at
               E4M3's subnormal ones (``buckets.tiny_scale_buckets``)
    ties       (buckets only; no decade: its note is "ties") rows whose values, each a block's peak or 4 times an E2M1 tie, have an
               exact mean square, eps fitted to make it a power of four (``ties_rows``, ``ties_eps``)
    near_constant  (buckets only) each row around its own mean m, |m| = 10**U(0, 4.8): constant,
               one step of the dtype either side of m, or a relative spread of 10**U(-7, -3)
Hostile rows (optional): a few rows replaced by zeros, a constant, near-max
values, or rows holding NaN / +inf / -inf.

Buckets, the shapes drawn on purpose, are ``buckets``'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from hypothesis import strategies as st

from ..declared import conventions
from ...oracle import OPS
from ...oracle.formats import compute_format, fmt, to_float64
from ...oracle.kinds import KINDS
from ...oracle.validate import stream_dtypes

from .buckets import (BLOCKS, HEAD_DIMS, MODEL_WIDTHS, NEAR_CONSTANT_EPS, NEAR_CONSTANT_SUBLAYER, QK_HEADS,
                      SEARCH_WIDTH, Bucket, choice, integer)
from .case import Case

PROFILES = ("normal", "lattice", "offset", "constant", "zeros", "near_max", "subnormal", "wide")
EXTREME = ("offset", "constant", "zeros", "near_max", "subnormal", "wide")
ROW_KINDS = ("zeros", "constant", "near_max", "nan", "posinf", "neginf")
LAYOUTS = ("contiguous", "transposed", "sliced", "offset")
MASK_KINDS = ("none", "all", "random", "single", "prefix")
PADDED_MASK_KINDS = ("random", "single", "prefix")
PAD_FILLS = ("keep", "nan", "huge", "zeros")
REFILLS = ("nan", "posinf", "neginf", "huge", "fresh")  # what the mask properties write over other rows

PRIMES = (2, 3, 5, 7, 13, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191)
POWERS = tuple(2 ** k for k in range(0, 15))  # up to 16384
ODD = (96, 100, 768, 1000, 3000, 5000, 6144, 12288)
MAX_ELEMS = 1 << 15


def round_up_row(n: int, dtype: torch.dtype, power: int) -> torch.Tensor:
    """A row of n elements in ``dtype`` whose sum of powers x^power (1: the mean's sum; 2: the sum
    of squares), taken left to right in the compute format (float32 for float16 / bfloat16 /
    float32, float64 for float64; p bits), rounds *up* at every step: the order and the data where
    a correct kernel's sum reaches the error model's gam(n) S (``error_model``), which rows drawn
    at random, or constant, never come near.

    Its first element A has A^power in [2^e, 2^(e+1)), the others b with b^power = 2^(e - p)
    (1 + ulp_x(1))^power, just above half an ulp of every partial sum s in [2^e, 2^(e+1)): so
    s + b^power rounds up to s + ulp(s), each step erring by almost ulp(s) / 2 = u 2^e, and after
    n - 1 steps the sum is about (n - 1) u 2^e too large: the relative error (n - 1) u that
    gam(n - 1) allows (rho = (mean + eps)^(-1/2) is then (n - 1) u / 2 off).  Squares: A = 1, e = 0
    for even p, A = 3/4, e = -1 for odd p (b = 2^((e - p) / 2) ...).  Sums: A = 2^e, e the least
    >= 0 that keeps b a normal number of x's dtype.  (The partial sums stay in the binade while
    (n - 1) 2^(1 - p) < 1: any drawn n.)"""
    p = compute_format(dtype).p
    step = 1 + 2 * fmt(dtype).u  # 1 + an ulp of 1 in x's dtype
    if power == 2:
        e = 0 if p % 2 == 0 else -1
        first, b = (1.0 if e == 0 else 0.75), 2.0 ** ((e - p) // 2) * step
    else:
        e = max(0, int(np.log2(fmt(dtype).lam)) + p)
        first, b = 2.0 ** e, 2.0 ** (e - p) * step
    row = torch.full((n,), b, dtype=torch.float64)
    row[0] = first
    return row.to(dtype)


def device_normal(shape: tuple[int, int], dtype, device, seed: int, stride: int | None = None,
                  chunk: int = 1 << 26) -> torch.Tensor:
    """Standard normal values rounded (nearest even) to ``dtype``, made on ``device`` a chunk at a
    time (no float32 copy of the whole tensor), as a (rows, width) view with row stride ``stride``
    (default: contiguous) into a ``surround`` buffer; the same bits for the same seed on the same device."""
    rows, width = shape
    stride = width if stride is None else stride
    gen = torch.Generator(device=device).manual_seed(seed)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    flat = surround(((rows - 1) * stride + width if rows else 0,), dtype, device)
    view = flat.as_strided((rows, width), (stride, 1))
    if stride == width:
        for a in range(0, flat.numel(), chunk):
            b = min(a + chunk, flat.numel())
            flat[a:b] = torch.randn(b - a, generator=gen, dtype=wide, device=device).to(dtype)
    else:
        for r in range(rows):
            view[r] = torch.randn(width, generator=gen, dtype=wide, device=device).to(dtype)
    return view


def row_lengths(max_n=SEARCH_WIDTH):
    """A row length up to max_n: a prime, a power of two, a common width, a released model's
    (``buckets.MODEL_WIDTHS``), or B + k past a block B of ``buckets.BLOCKS`` (k in [1, B)), or a
    short one (at most 300)."""
    special = st.sampled_from([n for n in dict.fromkeys(PRIMES + POWERS + ODD + MODEL_WIDTHS) if n <= max_n])
    past = st.sampled_from([b for b in BLOCKS if b + 1 <= max_n]).flatmap(
        lambda b: st.integers(b + 1, min(2 * b - 1, max_n))) if max_n > BLOCKS[0] else special
    return st.one_of(special, past, st.integers(1, min(max_n, 300)))


@st.composite
def shapes(draw, n=None, max_rank=4, max_elems=MAX_ELEMS, max_n=SEARCH_WIDTH, even=False, min_rows=0, multiple=1):
    """Rank 1..4; last dim n (a multiple of ``multiple``: rounded up to one, and kept <= max_n
    where max_n allows one);
    total <= max_elems (min_rows permitting).

    With min_rows = 0 leading dims may be empty; with min_rows >= 1 there are at
    least that many rows (prod(shape[:-1]) >= min_rows <= 8), built directly
    rather than filtered so that Hypothesis wastes no draws.
    """
    n = draw(row_lengths(max_n)) if n is None else n
    if even:
        n = 2 * max(1, n // 2)
    if multiple > 1 and n:  # at least one multiple, even past a small max_n (the op's shortest row)
        n = max(1, min(-(-n // multiple), max_n // multiple)) * multiple
    rank = draw(st.integers(2 if min_rows >= 2 else 1, max_rank))
    lead = []
    budget = max(1, max_elems // n)
    for i in range(rank - 1):
        lo = (min_rows if i == 0 else 1) if min_rows else 0
        d = draw(st.integers(lo, max(lo, min(8, budget))))
        lead.append(d)
        budget = max(1, budget // max(d, 1))
    return tuple(lead) + (n,)


@st.composite
def qk_shapes(draw, max_elems=MAX_ELEMS, max_n=SEARCH_WIDTH, min_rows=0):
    """(tokens, heads, head_dim) of a QK-norm call, or None where none fits: head_dim one of
    HEAD_DIMS (<= max_n), heads 1..QK_HEADS, tokens 1..4, at most max_elems elements and at least
    min_rows rows (tokens x heads)."""
    dims = [d for d in HEAD_DIMS if d <= max_n and max(min_rows, 1) * d <= max_elems]
    if not dims:
        return None
    d = draw(st.sampled_from(dims))
    heads = draw(st.integers(1, max(1, min(QK_HEADS, max_elems // d))))
    lo = -(-max(min_rows, 1) // heads)
    hi = max(lo, min(4, max_elems // (heads * d)))
    if lo * heads * d > max_elems:
        return None
    return (draw(st.integers(lo, hi)), heads, d)


def eps(bucket: Bucket | None = None):
    if bucket is not None and bucket.profile == "near_constant":
        return choice(NEAR_CONSTANT_EPS, bucket, "eps")
    common = choice([1e-12, 1e-6, 1e-5, 1e-3, 0.5], bucket, "eps")
    return st.one_of(common, st.floats(-12, math.log10(0.5)).map(lambda e: float(10.0 ** e)))


def quantisation_scales(bucket: Bucket | None = None):
    """A static quantisation scale (1 + m / 2**23) 2**k, k in [-12, 3]: float32-representable, as
    vLLM keeps it in a float32 tensor, and for outputs of order 1 spanning float8_e4m3fn's
    subnormals (below 2**-6) to its saturation (past 448)."""
    return st.tuples(integer(-12, 3, bucket, "scale k"), integer(0, 2 ** 23 - 1, bucket, "scale m")).map(
        lambda km: (1 + km[1] / 2 ** 23) * 2.0 ** km[0])


# ---------------------------------------------------------------- values
def lattice(rng, f, shape, e_lo, e_hi):
    """Random values of format f with unbiased exponents in [e_lo, e_hi] (e < emin: subnormal)."""
    e = rng.integers(e_lo, e_hi + 1, size=shape)
    m = rng.integers(0, 2 ** (f.p - 1), size=shape, dtype=np.int64).astype(np.float64)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    normal = np.ldexp(2.0 ** (f.p - 1) + m, e - f.p + 1)
    sub = np.ldexp(m, f.emin - f.p + 1)
    return sign * np.where(e >= f.emin, normal, sub)


def fill(rng, dtype, shape, profile, scale_exp):
    """float64 array of dtype-representable values drawn from one profile."""
    f = fmt(dtype)
    s = 10.0 ** scale_exp
    e_s = int(math.floor(math.log2(s)))
    if profile == "normal":
        return f.round(rng.standard_normal(shape) * s)
    if profile == "lattice":
        return lattice(rng, f, shape, e_s - 7, e_s)
    if profile == "offset":
        mean = s * 10.0 ** rng.uniform(3, 6) * (1 if rng.random() < 0.5 else -1)
        return f.round(np.clip(mean + s * rng.standard_normal(shape), -f.max, f.max))
    if profile == "constant":
        rows = lattice(rng, f, shape[:-1] + (1,), e_s - 7, e_s)
        return np.broadcast_to(rows, shape).copy()
    if profile == "zeros":
        return np.zeros(shape)
    if profile == "near_max":
        return lattice(rng, f, shape, f.emax - 2, f.emax)
    if profile == "subnormal":
        return lattice(rng, f, shape, f.emin - f.p + 1, f.emin + 1)
    if profile == "wide":
        return lattice(rng, f, shape, f.emin - f.p + 1, f.emax)
    if profile == "near_constant":
        return near_constant(rng, f, shape)
    if profile == "ties":
        return ties_rows(rng, shape)
    if profile == "tiny_scale":
        low = f.emin - f.p + 1
        rows = np.arange(int(np.prod(shape[:-1], dtype=np.int64))).reshape(shape[:-1] + (1,))
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        tiny = f.round(sign * np.ldexp(1 + 0.2 * rng.random(shape), max(-62, low)))
        return np.where(rows % 2 == 0, tiny, lattice(rng, f, shape, -4, -3))
    raise ValueError(f"unknown profile {profile!r}")


TIE_STEPS = (1, 3, 5, 7, 10, 14, 20)  # 4 w for E2M1's ties w = 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5
TIE_PEAK, TIE_BLOCK = 24, 16  # 4 x 6, one per block of 16 (and so two per MXFP4 block of 32)


def ties_rows(rng, shape):
    """Rows of a TIE_BLOCK multiple wide on E2M1's ties: one base row of blocks, each a peak
    +-TIE_PEAK and TIE_STEPS drawn, every row that base with its blocks and each block's elements
    permuted and signs drawn, all times 2**(k - 4), k in [-4, -1].  Every row has the same sum of
    squares (``ties_eps`` fits eps to it), every value has at most 5 significant bits (exact in
    every dtype), and under rms_norm with rho = 2**-j a block's scale amax / 6 is 2**(k - 2 - j), a
    power of two, against which a value is TIE_STEPS / 4: a tie."""
    rows, n = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    base = rng.choice(TIE_STEPS, size=(n // TIE_BLOCK, TIE_BLOCK)).astype(np.float64)
    base[:, 0] = TIE_PEAK
    every = rng.permuted(np.broadcast_to(base, (rows,) + base.shape), axis=-1)  # within each block
    order = np.argsort(rng.random((rows, base.shape[0])), axis=1)  # and the blocks, whole
    every = np.take_along_axis(every, order[..., None], axis=1)
    sign = np.where(rng.random(every.shape) < 0.5, -1.0, 1.0)
    return np.ldexp(sign * every, int(rng.integers(-4, 0)) - 4).reshape(shape)


def ties_eps(x) -> float:
    """eps that makes mean(x**2) + eps a power of four for the rows of ``x`` (``ties_rows``, all
    with one mean square m; rows a hostile kind replaced are outside): 4**j - m for the least
    4**j > m, exact in float32 (m has at most 16 significant bits)."""
    rows = x.reshape(-1, x.shape[-1])
    ms = np.mean(rows * rows, axis=-1)
    ms = ms[np.isfinite(ms)]
    values, counts = np.unique(ms, return_counts=True)
    m = float(values[np.argmax(counts)]) if len(values) else 0.0
    top = 4.0 ** math.floor(math.log(m, 4) + 1) if m > 0 else 1.0
    while top <= m:
        top *= 4
    return top - m


def near_constant(rng, f, shape):
    """Rows (the last dim) each around its own mean m, |m| = 10**U(0, 4.8) (below float16's max), of
    one of three kinds, drawn per row: constant (m itself, or, one row in two, m to 8 significant
    bits: a value such as 100 or -1.5, whose sum is exact in float32 at any width up to 2**16, so
    that every correct kernel's mean is exact and the bound tight: ``error_model.exact_mean_rows``),
    steps (m + k ulp(m), k in {-1, 0, 1}), or spread (m + |m| s N(0, 1), s = 10**U(-7, -3)); every
    value in format f.  Where the mean cancels: a variance of 0 or of a few ulps of m, which eps
    no longer dominates."""
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    n = shape[-1]
    top = min(4.8, math.log10(f.max) - 0.1)
    m = f.round(10.0 ** rng.uniform(0, top, (rows, 1)) * np.where(rng.random((rows, 1)) < 0.5, -1.0, 1.0))
    kind = rng.integers(0, 3, (rows, 1))
    e = np.frexp(m)[1]
    short = np.where(rng.random((rows, 1)) < 0.5, np.ldexp(np.round(np.ldexp(m, 8 - e)), e - 8), m)
    ulp = np.ldexp(1.0, e - f.p)
    steps = m + ulp * rng.integers(-1, 2, (rows, n))
    spread = m + np.abs(m) * 10.0 ** rng.uniform(-7, -3, (rows, 1)) * rng.standard_normal((rows, n))
    values = np.where(kind == 0, short, np.where(kind == 1, steps, spread))
    return f.round(values).reshape(shape)


def hostile_rows(rng, dtype, values, kinds):
    """Overwrite one random row per kind (rows = all but the last dim)."""
    if values.ndim < 2 or values.shape[-1] == 0 or not kinds:
        return values
    f = fmt(dtype)
    flat = values.reshape(-1, values.shape[-1])
    if flat.shape[0] == 0:
        return values
    for kind in kinds:
        r = int(rng.integers(0, flat.shape[0]))
        n = flat.shape[1]
        if kind == "zeros":
            flat[r] = 0.0
        elif kind == "constant":
            flat[r] = lattice(rng, f, (1,), -2, 2)[0]
        elif kind == "near_max":
            flat[r] = lattice(rng, f, (n,), f.emax - 2, f.emax)
        else:
            flat[r, int(rng.integers(0, n))] = {"nan": np.nan, "posinf": np.inf, "neginf": -np.inf}[kind]
    return flat.reshape(values.shape)


def surround(shape, dtype, device) -> torch.Tensor:
    """A fresh buffer for a view to be cut from, every element ``conventions.POISON`` (a NaN with a
    payload no arithmetic makes; zeros for a dtype without one): the storage around a view normcert
    hands to a kernel holds bits no kernel writes, so a write outside the view (a memset over the
    view's whole span) changes bits that ``sandbox.check_unmutated`` and the @inplace convention
    compare, instead of writing zeros over zeros."""
    return conventions.poisoned(shape, dtype, device)


def layout_tensor(values, dtype, layout, device):
    """A tensor holding exactly ``values`` in the given memory layout; any storage around it (the
    sliced rows' tails, a fused QKV buffer's q and v, an offset's head) is ``surround``'s."""
    shape = values.shape
    if layout == "transposed" and len(shape) >= 2:
        base = torch.from_numpy(np.ascontiguousarray(np.swapaxes(values, -1, -2))).to(dtype)
        return base.to(device).transpose(-1, -2)
    if layout == "sliced":
        buf = surround(shape[:-1] + (shape[-1] + 3,), dtype, device)
        buf[..., : shape[-1]] = torch.from_numpy(values).to(dtype)
        return buf[..., : shape[-1]]
    if layout == "fused_qkv":  # (tokens, heads, d): the k part of a (tokens, 3, heads, d) q|k|v buffer
        buf = surround(shape[:-2] + (3,) + shape[-2:], dtype, device)
        buf[..., 1, :, :] = torch.from_numpy(values).to(dtype)
        return buf[..., 1, :, :]
    if layout == "offset":
        buf = surround((values.size + 5,), dtype, device)
        buf[5:] = torch.from_numpy(values.reshape(-1)).to(dtype)
        return buf[5:].view(shape)
    return torch.from_numpy(np.ascontiguousarray(values)).to(dtype).to(device)


@st.composite
def tensors(draw, rng, dtype, shape, device, profiles=PROFILES, hostile=True, layouts=LAYOUTS, notes=None, name="x",
            bucket=None):
    profile = bucket.profile if bucket is not None and bucket.profile else draw(choice(profiles, bucket, name + "profile"))
    scale = bucket.scale if bucket is not None and bucket.scale is not None else draw(integer(-4, 4, bucket, name + "scale"))
    if bucket is not None and bucket.columns:  # the profile's groups run down the columns
        values = np.ascontiguousarray(fill(rng, dtype, shape[::-1], profile, scale).T)
    else:
        values = fill(rng, dtype, shape, profile, scale)
    kinds = draw(st.lists(st.sampled_from(ROW_KINDS), max_size=2, unique=True)) if hostile else []
    values = hostile_rows(rng, dtype, values, kinds)
    layout = bucket.layout if bucket is not None and bucket.layout else draw(choice(layouts, bucket, name + "layout"))
    if notes is not None:
        notes[name] = profile + ("" if profile == "ties" else f"@1e{scale}") + (f"+{'/'.join(kinds)}" if kinds else "") + \
            ("" if layout == "contiguous" else f"/{layout}")
    return layout_tensor(values, dtype, layout, device)


@st.composite
def vectors(draw, rng, n, x_dtype, device, name, around, profiles, bucket=None):
    """A length-n vector around ``around`` (a weight's 1, a bias's 0), in x.dtype or float32, by one of
    ``profiles``: "ones" / "zeros" (``around`` itself), "normal" (around + N(0, 1)), "lattice"
    (random bit patterns, exponents in [-3, 1]); contiguous or at stride 2 (every other element
    ``surround``'s).  ``name`` salts the spins."""
    dtype = draw(choice([x_dtype, torch.float32], bucket, name + "dtype"))
    f = fmt(dtype)
    profile = draw(choice(list(profiles), bucket, name))
    if profile in ("ones", "zeros"):
        v = np.full(n, around)
    elif profile == "normal":
        v = f.round(around + rng.standard_normal(n))
    else:
        v = lattice(rng, f, (n,), -3, 1)
    strided = draw(st.booleans() if bucket is None else choice([False, True], bucket, name + "strided"))
    if strided:
        buf = surround((2 * n,), dtype, device)
        buf[::2] = torch.from_numpy(v).to(dtype)
        return buf[::2]
    return torch.from_numpy(v).to(dtype).to(device)


@st.composite
def masks(draw, rng, lead, device, padded=False, bucket=None):
    """(mask, kind); with padded=True (and >= 2 positions) at least one position is padding."""
    kind = draw(choice(PADDED_MASK_KINDS if padded else MASK_KINDS, bucket, "mask"))
    size = int(np.prod(lead)) if lead else 1
    if kind == "none":
        return None, kind
    if kind == "all" or size == 0:
        m = np.ones(lead, bool)
    elif kind == "single":
        m = np.zeros(size, bool)
        m[int(rng.integers(0, size))] = True
        m = m.reshape(lead)
    elif kind == "prefix" and len(lead) >= 2:
        lengths = rng.integers(1, lead[-1] + 1, size=lead[:-1])
        m = np.arange(lead[-1]) < lengths[..., None]
    else:
        m = rng.random(size) < 0.6
        m[int(rng.integers(0, size))] = True
        m = m.reshape(lead)
    if padded and m.all() and size >= 2:
        flat = m.reshape(-1)
        flat[int(rng.integers(1, size))] = False  # position 0 stays valid
        m = flat.reshape(lead)
    return torch.from_numpy(np.array(m, dtype=bool)).to(device), kind  # keeps 0-d masks 0-d


COUNT_KINDS = ("random", "ends", "empty", "full")  # how an expert's valid rows are drawn (``counts``)


@st.composite
def counts(draw, rng, lead, tokens, device, padded=False, bucket=None):
    """(counts of shape ``lead``, kind): each expert's valid rows in [0, tokens], both ends drawn:
    "random" uniform over [0, tokens]; "ends" each 0 or tokens; "empty" all 0 but one expert full;
    "full" all tokens.  With padded=True (and tokens >= 1) at least one row is padding."""
    kinds = COUNT_KINDS[:3] if padded else COUNT_KINDS
    kind = draw(choice(kinds, bucket, "counts"))
    size = int(np.prod(lead)) if lead else 1
    if kind == "random":
        c = rng.integers(0, tokens + 1, size=size)
    elif kind == "ends":
        c = rng.choice([0, tokens], size=size)
    elif kind == "empty":
        c = np.zeros(size, dtype=np.int64)
        c[int(rng.integers(0, size))] = tokens
    else:
        c = np.full(size, tokens)
    if padded and tokens and (c == tokens).all():
        c[int(rng.integers(0, size))] = int(rng.integers(0, tokens))
    dtype = torch.int32 if rng.integers(0, 2) else torch.int64
    return torch.from_numpy(np.asarray(c, dtype=np.int64).reshape(lead)).to(dtype).to(device), kind


def pad_values(x, mask, fill_kind, rng):
    """x with its padded positions overwritten (NaN, huge, zeros), to prove they are never read."""
    if mask is None or fill_kind == "keep":
        return x
    f = fmt(x.dtype)
    value = {"nan": float("nan"), "huge": f.max, "zeros": 0.0}[fill_kind]
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)  # clone() would drop a row stride
    out.copy_(x)
    out[~mask] = value
    return out


@dataclass
class Drawing:
    """One case's draws, as an argument kind asks for them (``oracle.kinds.Kind.draw``): the
    Hypothesis ``draw``, the case's numpy generator, its dtype, device and shape, the bucket whose
    spins it follows, and the notes it writes.  ``tensors`` holds the tensors drawn so far, by name,
    ``scalars`` the other arguments (a global scale drawn after its block format reads it)."""

    draw: Callable
    rng: np.random.Generator
    dtype: torch.dtype
    device: object
    shape: tuple
    bucket: Bucket | None
    notes: dict
    main: str
    profiles: tuple
    hostile: bool
    layouts: tuple
    padded: bool
    tensors: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.shape[-1]

    def rows(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A tensor of the case's shape (in its dtype, or ``dtype``): a value profile, hostile rows,
        a layout (``tensors``)."""
        return self.draw(tensors(self.rng, dtype or self.dtype, self.shape, self.device, profiles=self.profiles,
                                 hostile=self.hostile, notes=self.notes, name=name, bucket=self.bucket,
                                 layouts=self.layouts))

    def stream(self, name: str) -> torch.Tensor:
        """A residual stream: ``rows`` in the case's dtype or, for float16 / bfloat16, float32 (a
        ``residual_in_fp32`` stream) in half the cases."""
        dtype = self.choose(list(stream_dtypes(self.dtype)), name + " dtype")
        if self.bucket is not None and self.bucket.profile == "ties":  # s = x, as ``ties_eps`` fitted eps to x
            return torch.zeros(self.shape, dtype=dtype, device=self.device)
        return self.rows(name, dtype)

    def vector(self, name: str, around: float, profiles: tuple[str, ...]) -> torch.Tensor:
        fixed = self.fixed
        profiles = (fixed[name],) if name in fixed else profiles
        return self.draw(vectors(self.rng, self.n, self.dtype, self.device, name, around, profiles, self.bucket))

    @property
    def sublayer_scale(self) -> float:
        """The factor on a sublayer's weights (the matrix and vector kinds): NEAR_CONSTANT_SUBLAYER
        under a near-constant bucket, so that deep_norm's z = alpha x + A x + c keeps x's
        near-constant rows, else 1."""
        return NEAR_CONSTANT_SUBLAYER if self.bucket is not None and self.bucket.profile == "near_constant" else 1.0

    def gaussian(self, shape: tuple, scale: float) -> torch.Tensor:
        """N(0, scale**2) values rounded to the case's dtype."""
        values = fmt(self.dtype).round(scale * self.rng.standard_normal(shape))
        return torch.from_numpy(values).to(self.dtype).to(self.device)

    def mask(self, name: str) -> torch.Tensor | None:
        """A mask of the case's leading dims (``masks``); its padded positions of the main tensor
        are overwritten (``pad_values``: NaN, huge, zeros, or kept) to prove they are never read."""
        m, self.notes[name] = self.draw(masks(self.rng, self.shape[:-1], self.device, padded=self.padded,
                                              bucket=self.bucket))
        fill_kind = self.draw(choice(PAD_FILLS, self.bucket, "fill"))
        if m is not None and fill_kind != "keep":
            self.notes["padding"] = fill_kind
            self.tensors[self.main] = pad_values(self.tensors[self.main], m, fill_kind, self.rng)
        return m

    def counts(self, name: str) -> torch.Tensor:
        """Valid rows per expert of the case's (experts..., tokens, n) main tensor (``counts``); the
        rows past them are overwritten as a mask's padded positions are (``pad_values``)."""
        c, self.notes[name] = self.draw(counts(self.rng, self.shape[:-2], self.shape[-2], self.device,
                                               padded=self.padded, bucket=self.bucket))
        fill_kind = self.draw(choice(PAD_FILLS, self.bucket, "fill"))
        if fill_kind != "keep":
            self.notes["padding"] = fill_kind
            valid = torch.arange(self.shape[-2], device=self.device) < c[..., None]
            self.tensors[self.main] = pad_values(self.tensors[self.main], valid, fill_kind, self.rng)
        return c

    def eps(self) -> float:
        if self.bucket is not None and self.bucket.profile == "ties":
            return ties_eps(to_float64(self.tensors[self.main]))
        return self.draw(eps(self.bucket))

    def quantisation_scale(self) -> float:
        return self.draw(quantisation_scales(self.bucket))

    @property
    def fixed(self) -> dict:
        """The choices the bucket makes instead of drawing them (``Bucket.fixed``): salt -> value."""
        return dict(self.bucket.fixed) if self.bucket is not None else {}

    def choose(self, xs, salt: str):
        fixed = self.fixed
        return fixed[salt] if salt in fixed else self.draw(choice(xs, self.bucket, salt))

    def note(self, name: str, text: str) -> None:
        self.notes[name] = text


@st.composite
def cases(draw, op, dtype, device, profiles=PROFILES, hostile=True, max_elems=MAX_ELEMS, max_n=SEARCH_WIDTH,
          min_rows=0, padded=False, bucket=None):
    """A Case for ``op`` with the given dtype on the given device, every argument drawn by its kind.

    rows tensors from ``profiles`` (with hostile rows if asked); weight and bias
    vectors (an optional one None in a third of the cases: a weightless call); an
    n x n sublayer scaled by 1/sqrt(n) and a small bias; a mask with padded
    positions overwritten (NaN, huge, zeros) to prove they are never read; eps;
    alpha = (2N)^(1/4) for N layers; GELU's form; a quantisation scale.  For a ``headwise`` op a quarter
    of the cases are QK-norm calls (``qk_shapes``: tokens x heads x head_dim, the k
    part of a fused QKV buffer), where one fits the limits.  min_rows: at least
    this many rows (positions, for a masked op); padded: a mask with at least one
    padded position.
    bucket: the shape is the bucket's (max_elems, max_n, min_rows do not apply) and
    every other choice is spun (``choice``).
    """
    rec = OPS[op]
    if padded or rec.counts:  # a masked MoE op's x is (experts..., tokens, n): rank 2 at least
        min_rows = max(min_rows, 2)
    seed = draw(integer(0, 2 ** 32 - 1, bucket, "seed"))
    rng = np.random.default_rng(seed)
    notes = {"seed": str(seed)}
    layouts = LAYOUTS
    qk = None
    if bucket is None and rec.headwise and draw(st.integers(0, 3)) == 3:  # a quarter of the cases
        qk = draw(qk_shapes(max_elems, min(max_n, rec.max_width), min_rows))
    if qk is not None:  # QK-norm: per head of a fused QKV projection's k part
        shape, layouts = qk, ("fused_qkv",)
    elif bucket is None:
        shape = draw(shapes(max_elems=max_elems, max_n=min(max_n, rec.max_width), max_rank=rec.max_rank,
                            even=rec.halves, min_rows=min_rows,
                            multiple=rec.width_multiple * (2 if rec.halves else 1)))
    else:
        shape = bucket.shape(rec)
        notes["bucket"] = bucket.label
    d = Drawing(draw, rng, dtype, device, shape, bucket, notes, rec.main, profiles, hostile, layouts, padded)
    for arg in rec.args:
        kind = KINDS[arg.kind]
        value = kind.draw(d, arg)
        if kind.tensor:
            d.tensors[arg.name] = value
        else:
            d.scalars[arg.name] = value
    return Case(op, d.tensors, d.scalars, notes)


def cotangents(rng, shapes_dtypes, device):
    """Random upstream gradients, one per output, in the output dtype."""
    out = []
    for shape, dtype in shapes_dtypes:
        f = fmt(dtype)
        out.append(torch.from_numpy(f.round(rng.standard_normal(shape))).to(dtype).to(device))
    return tuple(out)


def transforms(op) -> tuple[str, ...]:
    """The invariances of op record ``op`` the invariance family checks: "scale", "shift"."""
    return tuple(k for k, ok in (("scale", op.scale_invariant), ("shift", op.shift_invariant)) if ok)


def scales(bucket: Bucket | None = None):
    """Powers of two c = 2**k: c x and c**2 eps are exact, so y(c x, c**2 eps) = y(x, eps) exactly."""
    return integer(-6, 6, bucket, "scale c").map(lambda k: 2.0 ** k)
