"""The search's buckets: shapes drawn on purpose, not by luck, and the spun choices under them.

Buckets (``buckets``): one long row,
odd widths just past block boundaries (contiguous, and with a row stride larger
than the width), many rows at a small width.  A family lists the buckets it covers
(``families.Family.buckets``); each is one scheduled case per (kernel, family,
dtype), run after the random search.  Hypothesis tries the simplest case of a
strategy first, so with a bucket every other choice (profile, layout, eps,
value seed, ...) is *spun*: its list is rotated by an amount derived from the
run's seed (``choice``, ``integer``), so that the first case differs per seed
and a failure still shrinks.  A centred op (``Op.centred``) also gets the near-constant
buckets (``near_constant_buckets``): offset rows whose mean cancels, at four bucket widths.  An FP4
op also gets the tiny-scale buckets (``tiny_scale_buckets``): blocks whose scale is at or below its
format's smallest normal, one bucket per block format; an FP4 norm the ties buckets (``ties_buckets``):
rows every correct order computes exactly, their values on E2M1's ties.
"long_run" (``LONG_RUN``) is not a shape but a count: one small case the served family calls
``Bucket.calls`` times in a row (``families.long_run``).

``--profile large`` (a GPU) has its own: ``large_buckets`` cross 2**31 elements.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import strategies as st

from ..declared.domain import MANY_ROWS

SEARCH_WIDTH = 16384
"""The random search's longest x row (``strategies.row_lengths``): past 4096 (a single block) and 8192,
and a norm's widest hidden size (Llama-3.1 405B's).  Wider rows, a gated activation's MLP widths, are
the "model" bucket's."""
LONG_WIDTH = 16384  # one row: past 4096 (a single block) and 8192
BLOCKS = (256, 512, 1024, 4096, 8192)  # the block sizes of the buckets' widths: a kernel's tile of a row
ODD_WIDTHS = (769, 3584, 5125, 4097, 8193)  # just past multiples of 256, 512, 1024, 4096, 8192 (BLOCKS)
PAST_ROWS = 2  # "past": rows of B + k, one bucket per block B of BLOCKS, k spun in [1, B)
MODEL_ROWS = 2  # "model": rows of one of MODEL_WIDTHS, spun (one row past the search's widths)
MODEL_WIDTHS = (9216, 12288, 13824, 14336, 14848, 16384, 18432, 20480, 28672, 29568, 53248)
"""Row lengths of released models past 8192 (each model's published configuration: its paper or its
``config.json``): hidden sizes 9216 (OPT-66B), 12288 (GPT-3 175B, OPT-175B, Command R+), 14336
(BLOOM-176B), 14848 (Falcon-180B), 16384 (Llama-3.1 405B), 18432 (PaLM 540B, Nemotron-4 340B), 20480
(MT-NLG 530B); MLP widths, an activation's row, 13824 (Llama-2 13B, Qwen2.5-14B), 14336 (Mistral 7B,
Mixtral 8x7B, Llama-3 8B), 18432 (DeepSeek-V3's dense layers), 20480 (Yi-34B), 28672 (Llama-2 70B,
Llama-3 70B), 29568 (Qwen2-72B), 53248 (Llama-3.1 405B).  (Llama-2/3 70B and Qwen2-72B are 8192
wide, a block: "long" and "odd" hold it.)  The "model" bucket draws those an op's max_width admits
past the random search's longest row where there are any (a gated activation's, up to
``oracle.ops.MLP_WIDTH``), else any of them (a norm's, up to 16384, which the search's row lengths
also hold)."""
MANY_ROWS_INTERPRETED = 1025  # under Triton's interpreter every program is a Python loop iteration
LONG_RUN = "long_run"  # the served family's bucket of many calls on one small case
LONG_RUN_CALLS = 1 << 16  # its calls: past a 2048-slot ring, a 4096-slot one and an int16 counter's 32767
LONG_RUN_EVERY = 8193
"""The long run's calls in every dtype of the run but the one that makes LONG_RUN_CALLS
(``schedule.long_run_calls``): past a 2048-, a 4096- and an 8192-slot ring and a one-in-5000 call,
at an eighth of the full count's cost (``families.long_run``)."""
LONG_RUN_INTERPRETED = 257
"""The long run's calls under Triton's interpreter (on CPU), past a uint8 counter's wrap: each
interpreted launch is a Python loop of about 20 ms on the 2-core machine, so 4097 calls of each of
the registry's 24 Triton kernels would add half an hour to the heavy tier; 257 add about two
minutes.  A 2048-slot ring is past it: a Triton kernel's full count is a GPU's."""
QUICK_LONG_RUN = 4097
"""The long run's calls in the quick tier on CPU (``run.plugin``), past a 2048- and a 4096-slot
ring, where the clone's ``pytest -n 2`` certifies the registry's own kernels: 2**16 calls of each
of its 37 CPU kernels, in one dtype each, take about 390 s of the 2-core machine, 4097 about 24 s.
A run of plugged kernels (``normcert certify``) makes the full count."""
QUICK_LONG_RUN_EVERY = 257
"""The quick tier's calls in each other dtype (``schedule.long_run_calls``): 4097 in three more
dtypes of each of the 37 kernels would add about 72 s of the two cores to the default run; 257
(as many as Triton's interpreter makes) add about 5 s, and run every dtype's outputs through the
long run's checks.  The registry's kernels keep no state across calls; the planted ones that do
are the meta-tests' (``tests/meta/test_long_run``), with counts of their own."""
LONG_RUN_ROWS, LONG_RUN_WIDTH = 2, 8  # its small case (the width rounded up to whole groups)
SMALL_WIDTHS = (2, 3, 4)  # 65537 rows of these: under 2**18 elements, and 2**19 for halves
HEAD_DIMS = (64, 128, 256)  # QK-norm: Llama-4, Qwen3, OLMo2, Gemma 3 ...
QK_HEADS = 64  # past the 32 heads a (tokens, 32) grid would cover
QK_TOKENS = 3


@dataclass(frozen=True)
class Bucket:
    """A scheduled shape: ``rows`` x ``width`` (width: the output row's length; x is twice as
    wide for ``halves`` ops), or rows x ``heads`` x width where heads > 0; row tensors in
    ``layout`` (None: drawn), other choices spun by ``spin``; ``note``: how it differs from the
    bucket's nominal size."""

    name: str
    rows: int
    width: int
    layout: str | None = None
    spin: int = 0
    note: str = ""
    heads: int = 0
    profile: str | None = None  # the row tensors' value profile (None: drawn)
    columns: bool = False  # the profile's groups are columns (an op that normalises over rows)
    calls: int = 0  # the consecutive calls a long-run case makes (``LONG_RUN``); 0: one call
    turn: int = 0  # its place in its family's schedule (``runner.scheduled``): a context field cycles with it
    cycle: int = 0  # the run's spin of that schedule: where each field's cycle starts (``cycled``)
    fixed: tuple = ()  # (salt, value) pairs: choices the bucket makes instead of spinning them
    scale: int | None = None  # its tensors' decade (``strategies.tensors``: values about 10**scale); None: drawn

    def shape(self, rec) -> tuple[int, ...]:
        return (self.rows,) + ((self.heads,) if self.heads else ()) + (2 * self.width if rec.halves else self.width,)

    @property
    def label(self) -> str:
        text = f"{self.name} {self.rows}x" + (f"{self.heads}x" if self.heads else "") + f"{self.width}"
        return text + (f" ({self.note})" if self.note else "")


BUCKETS = ("long", "odd", "strided", "past", "model", "many", "qk", "million", "near_constant", "tiny_scale", "ties",
           "loud")
LOUD_SCALE = 4  # "loud": the top decade the search draws (``strategies.tensors``' scale in [-4, 4])
LOUD_ELEMS = 1 << 15  # "loud": about this many elements
MILLION = 1 << 20  # elements: "million" is one call past it (on CPU; --profile large goes past 2**31 on a GPU)
MILLION_WIDTH = 4096  # its rows' x-width: 257 rows, 257 programs under Triton's interpreter
MILLION_MIN_WIDTH = 1024  # ops capped below this (deep_norm's n x n sublayer) would need too many rows


def buckets(rec, spin: int, interpreted: bool = False, calls: int = LONG_RUN_CALLS) -> tuple[Bucket, ...]:
    """The scheduled shapes for op record ``rec`` under a run's ``spin``:

    long     1 row of LONG_WIDTH (one row, longer than any single block)
    odd      3 rows of one of ODD_WIDTHS, layout drawn
    strided  3 rows of another of ODD_WIDTHS, row stride > width (the "sliced" layout)
    past     PAST_ROWS rows of B + k for each block B of BLOCKS, k spun in [1, B): a last partial
             block of any length, not only a +1 tail (one bucket per B; those past the op's
             max_width left out)
    model    MODEL_ROWS rows of one of MODEL_WIDTHS the op admits, spun: a released model's row;
             where some are past the search's longest output row (SEARCH_WIDTH, halved for a
             halves op), one row of one of those: a row no random case reaches
    many     MANY_ROWS rows of a small width
    qk       (headwise ops) QK_TOKENS x QK_HEADS x one of HEAD_DIMS, the k part of a fused QKV
             projection (layout "fused_qkv"): QK-norm as models call it
    million  MILLION // w + 1 rows of x-width w = MILLION_WIDTH: one call past 2**20 elements (ops
             whose max_width allows at least MILLION_MIN_WIDTH)
    long_run LONG_RUN_ROWS x LONG_RUN_WIDTH, called ``calls`` times in a row
    loud     about LOUD_ELEMS elements, every tensor's values about 10**LOUD_SCALE (the top decade
             the search draws, each tensor at it one case in nine when drawn): in float16 a product
             of an input and dy (an autograd that rounds dy up to float16) passes 65504 (``_loud``)

    Widths are capped at the op's ``max_width``; with ``interpreted`` (a kernel that runs
    under Triton's interpreter) "many" has MANY_ROWS_INTERPRETED rows and "long_run" at most
    LONG_RUN_INTERPRETED calls."""
    cap = _output_row(rec, rec.max_width)

    def make(name, rows, width, layout=None, note="", heads=0, count=0):
        if width > cap:
            width, note = cap, f"width capped at the op's {cap}"
        wider = _whole_groups(rec, width)
        if wider != width:
            if name == "many":  # as many elements, fewer rows
                rows = max(2, rows * width // wider)
            rounded = f"width rounded up to a multiple of {rec.width_multiple}"
            width, note = wider, ", ".join(filter(None, (note, rounded)))
        return Bucket(name, rows, width, layout, _mix(spin, name), note, heads, calls=count)

    odd = _mix(spin, "odd") % len(ODD_WIDTHS)
    many = (MANY_ROWS_INTERPRETED, f"scaled from {MANY_ROWS} rows: Triton's interpreter") if interpreted \
        else (MANY_ROWS, "")
    qk = (make("qk", QK_TOKENS, HEAD_DIMS[_mix(spin, "qk") % len(HEAD_DIMS)], "fused_qkv", heads=QK_HEADS),) \
        if rec.headwise else ()
    scaled = interpreted and calls > LONG_RUN_INTERPRETED
    long_run = make(LONG_RUN, LONG_RUN_ROWS, LONG_RUN_WIDTH, count=LONG_RUN_INTERPRETED if scaled else calls,
                    note=f"{LONG_RUN_INTERPRETED} calls, scaled from {calls}: Triton's interpreter" if scaled
                    else f"{calls} calls")
    return (make("long", 1, LONG_WIDTH),
            make("odd", 3, ODD_WIDTHS[odd]),
            make("strided", 3, ODD_WIDTHS[(odd + 2) % len(ODD_WIDTHS)], layout="sliced"),
            *_past(cap, spin, make), *_model(cap, _output_row(rec, SEARCH_WIDTH), spin, make),
            make("many", many[0], SMALL_WIDTHS[_mix(spin, "many") % len(SMALL_WIDTHS)], note=many[1])) + qk \
        + _million(rec, spin) + near_constant_buckets(rec, spin) + tiny_scale_buckets(rec, spin) + ties_buckets(rec, spin) + (long_run,) \
        + _loud(rec, spin, make)


def _past(cap: int, spin: int, make) -> tuple[Bucket, ...]:
    """"past": for each block B of BLOCKS with 2 B - 1 <= ``cap`` (the op's longest output row),
    PAST_ROWS rows of B + k, k = 1 + (a spin of the run) mod (B - 1): over seeds, every length of
    a last partial block, where ODD_WIDTHS hold one each."""
    ks = [(b, 1 + _mix(spin, f"past {b}") % (b - 1)) for b in BLOCKS if 2 * b - 1 <= cap]
    return tuple(make("past", PAST_ROWS, b + k, note=f"{b} + {k}") for b, k in ks)


def _model(cap: int, searched: int, spin: int, make) -> tuple[Bucket, ...]:
    """"model": one of the MODEL_WIDTHS within ``cap``, spun (none where none is): one row of one
    past ``searched`` (the random search's longest output row) where any is, so that over seeds every
    MLP width the search never draws is run; else MODEL_ROWS rows of any of them."""
    past = [w for w in MODEL_WIDTHS if searched < w <= cap]
    widths, rows = (past, 1) if past else ([w for w in MODEL_WIDTHS if w <= cap], MODEL_ROWS)
    return (make("model", rows, widths[_mix(spin, "model") % len(widths)]),) if widths else ()


def _loud(rec, spin: int, make) -> tuple[Bucket, ...]:
    """"loud": about LOUD_ELEMS elements (rows of an odd width: many dy values even where dy is one
    row expanded), every tensor's values normal about 10**LOUD_SCALE (a family may cap the elements:
    gradients' 2**13 leave some eight).  A product of two such inputs' elements and a standard
    normal dy, |dy u| ~ 10**4 |Z1 Z2|, passes float16's 65504 where |Z1 Z2| > 6.55, about one
    element in a thousand."""
    width = ODD_WIDTHS[_mix(spin, "loud") % len(ODD_WIDTHS)]
    bucket = make("loud", max(3, LOUD_ELEMS // width), width, note=f"values about 1e{LOUD_SCALE}")
    return (replace(bucket, scale=LOUD_SCALE, profile="normal"),)


def _output_row(rec, x_width: int) -> int:
    """The output row's length for x rows ``x_width`` long: half of it for a halves op ([gate | up])."""
    return x_width // 2 if rec.halves else x_width


def _whole_groups(rec, width: int) -> int:
    """width rounded up to a multiple of the op's width_multiple: a per-group op's groups divide every row."""
    return -(-width // rec.width_multiple) * rec.width_multiple


NEAR_CONSTANT_ELEMS = 1 << 15  # elements per near-constant bucket: groups = this // width, clamped to ...
NEAR_CONSTANT_GROUPS = (4, 64)  # ... these: many rows, as one kind in three is a constant row
NEAR_CONSTANT_EPS = (1e-12, 1e-10, 1e-8, 1e-6, 1e-5)  # small: eps does not hide a cancelled variance
NEAR_CONSTANT_SUBLAYER = 2.0 ** -24  # deep_norm's sublayer, scaled so z = alpha x + A x + c stays near-constant


def near_constant_buckets(rec, spin: int) -> tuple[Bucket, ...]:
    """For a centred op (``Op.centred``), groups of profile "near_constant" at four widths of the
    shape buckets: LONG_WIDTH, the odd width, the small width of "many", and MILLION_WIDTH (a power
    of two: one block); eps from NEAR_CONSTANT_EPS.  (Not the strided layout: layouts are the shape
    buckets' question, and the near-constant ones are the suite's costliest per element.)  About
    NEAR_CONSTANT_ELEMS elements each: NEAR_CONSTANT_ELEMS // width groups, within NEAR_CONSTANT_GROUPS.
    A group is a row, or for an op that is not rowwise (batch_norm normalises a channel over
    positions) a column: the bucket is then width positions x that many channels.  Widths are
    capped at the op's ``max_width`` (a row's length; positions are not capped)."""
    if not rec.centred:
        return ()
    cap = _output_row(rec, rec.max_width)
    odd = _mix(spin, "odd") % len(ODD_WIDTHS)
    widths = (("long", LONG_WIDTH), ("odd", ODD_WIDTHS[odd]),
              ("many", SMALL_WIDTHS[_mix(spin, "many") % len(SMALL_WIDTHS)]), ("million", MILLION_WIDTH))
    out = []
    for width_of, width in widths:
        note = f"{width_of} width"
        if rec.rowwise and width > cap:
            width, note = cap, f"{width_of} width capped at the op's {cap}"
        if _whole_groups(rec, width) != width:
            width, note = _whole_groups(rec, width), f"{note}, rounded up to a multiple of {rec.width_multiple}"
        groups = min(max(NEAR_CONSTANT_ELEMS // width, NEAR_CONSTANT_GROUPS[0]), NEAR_CONSTANT_GROUPS[1])
        rows, cols = (groups, width) if rec.rowwise else (width, groups)
        out.append(Bucket("near_constant", rows, cols, None, _mix(spin, "near_constant " + width_of), note,
                          profile="near_constant", columns=not rec.rowwise))
    return tuple(out)


TINY_SCALE_ROWS, TINY_SCALE_WIDTH = 8, 64  # two blocks of 32, four of 16, per output row


def tiny_scale_buckets(rec, spin: int) -> tuple[Bucket, ...]:
    """For an FP4 op (an argument of kind "block_format"), TINY_SCALE_ROWS x TINY_SCALE_WIDTH rows of
    profile "tiny_scale" (``strategies.fill``: rows alternately of +-(1 + U(0, 0.2)) 2**-62 and of
    exponents in [-4, -3]), once with block format "mxfp4" and once "nvfp4" (fixed, not spun): a
    SwiGLU's v = silu(g) u ~ g u / 2 is then in [2**-125, 1.44 2**-125) (UE8M0's least scale
    2**-127, exponent byte 0, holds amax up to 6 2**-127 = 1.5 2**-125; v / 2**-127 in [4, 5.8),
    past the 4 that the flush-to-zero allowance of a float32 v, 2 lam_o = 2**-125, spans) or in
    [2**-9, 2**-5) (S = amax / 6 among E4M3's subnormals, below 2**-6), so that a kernel's special case for a zero
    exponent or a subnormal scale meets its case.  (A norm's v is normalised, so its blocks stay
    near 1: the tiny scales are an activation's.)  float16 cannot hold 2**-62: its rows go to its
    subnormals, the nearest it has."""
    if not any(a.kind == "block_format" for a in rec.args):
        return ()
    return tuple(Bucket("tiny_scale", TINY_SCALE_ROWS, TINY_SCALE_WIDTH, None, _mix(spin, f"tiny_scale {form}"), form,
                        profile="tiny_scale", fixed=(("block_format", form),)) for form in ("mxfp4", "nvfp4"))


TIES_ROWS, TIES_WIDTH = 4, 64  # a power of two: the mean of squares is exact (``oracle.lattice``)


def ties_buckets(rec, spin: int) -> tuple[Bucket, ...]:
    """For an FP4 norm (arguments of kinds "block_format" and "eps"), TIES_ROWS x TIES_WIDTH rows of
    profile "ties" (``strategies.ties_rows``), once with block format "mxfp4" and once "nvfp4",
    global scale 1 and weight ones (fixed): every intermediate of rms_norm on them is exact
    (``oracle.lattice``'s conditions; eps is fitted to the rows, ``strategies.ties_eps``), each
    block's scale is a power of two and v / s lands on E2M1's ties 0.25 ... 5, so that under
    arithmetic=ieee y is checked bit for bit where the rounding of a tie decides it.  A residual is
    zeros (s = x)."""
    kinds = {a.kind for a in rec.args}
    if not {"block_format", "eps"} <= kinds:
        return ()
    return tuple(Bucket("ties", TIES_ROWS, TIES_WIDTH, None, _mix(spin, f"ties {form}"), form, profile="ties",
                        fixed=(("block_format", form), ("global_scale", 1.0), ("weight", "ones")))
                 for form in ("mxfp4", "nvfp4"))


def _million(rec, spin: int) -> tuple[Bucket, ...]:
    x_width = min(MILLION_WIDTH, rec.max_width)
    if x_width < MILLION_MIN_WIDTH:
        return ()
    rows = MILLION // x_width + 1
    return (Bucket("million", rows, _output_row(rec, x_width), "contiguous", _mix(spin, "million"),
                   f"{rows * x_width} elements"),)


# ---------------------------------------------------------------- large (--profile large, a GPU)
INT32_LIMIT = 2 ** 31  # elements: past it, an offset row * stride held in int32 wraps (FlashInfer#3005)
LARGE_WIDTH = 4096
LARGE_ROWS_PAST = 64  # rows of "huge" that start past the limit
FAR_STRIDE_PAST = 128  # "far": the second row starts this many elements past the limit
LARGE_SAMPLE = 16  # random rows checked below the limit
LARGE = ("huge", "far")


def large_buckets(rec, spin: int, limit: int = INT32_LIMIT) -> tuple[Bucket, ...]:
    """The shapes of ``--profile large`` for op record ``rec`` (``limit``: the element count they
    cross; a meta-test passes a small one to check the same logic on the CPU):

    huge  limit // w + LARGE_ROWS_PAST rows of x-width w (LARGE_WIDTH, capped at the op's
          max_width; x is twice as wide for halves ops): more than ``limit`` elements
    far   2 rows of width w, row stride limit + FAR_STRIDE_PAST elements (the "far" layout)"""
    cap = _output_row(rec, rec.max_width)
    width = min(LARGE_WIDTH, cap)
    x_width = 2 * width if rec.halves else width
    rows = limit // x_width + LARGE_ROWS_PAST
    return (Bucket("huge", rows, width, "contiguous", _mix(spin, "huge"), f"{rows * x_width} elements"),
            Bucket("far", 2, width, "far", _mix(spin, "far"), f"row stride {limit + FAR_STRIDE_PAST}"))


def large_stride(rec, bucket: Bucket, limit: int = INT32_LIMIT) -> int:
    """The row stride, in elements, of a row tensor of ``bucket``'s case."""
    return limit + FAR_STRIDE_PAST if bucket.layout == "far" else bucket.shape(rec)[1]


def large_storage(rec, bucket: Bucket, limit: int = INT32_LIMIT) -> int:
    """Elements of the storage behind one row tensor of ``bucket``'s case."""
    rows, x_width = bucket.shape(rec)
    return (rows - 1) * large_stride(rec, bucket, limit) + x_width


def large_rows_checked(rows: int, stride: int, limit: int, seed: int) -> list[int]:
    """The rows of a large case the oracle checks: every row from the last one that starts below
    element ``limit`` on (past the limit, int32 offsets wrap), the first row, and LARGE_SAMPLE
    rows drawn below the limit (``stride``: the row stride in elements)."""
    start = max(0, min(rows, -(-limit // stride)) - 1)
    below = np.random.default_rng(seed).integers(0, max(start, 1), LARGE_SAMPLE)
    return sorted({0, *range(start, rows), *(int(r) for r in below if r < rows)})


def _mix(spin: int, salt: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{spin}:{salt}".encode()).digest()[:8], "little")


def choice(xs, bucket: Bucket | None = None, salt: str = ""):
    """``sampled_from(xs)``; under a bucket, xs rotated by the bucket's spin (salted per choice),
    so that the example Hypothesis tries first -- the first element -- differs per seed."""
    xs = tuple(xs)
    if bucket is None:
        return st.sampled_from(xs)
    k = _mix(bucket.spin, salt) % len(xs)
    return st.sampled_from(xs[k:] + xs[:k])


def cycled(xs, bucket: Bucket, salt: str = ""):
    """``sampled_from(xs)`` rotated by k = (turn + o) mod len(xs), o spun by the run (``Bucket.cycle``,
    salted per choice): the example each bucket tries first takes the next element in turn, so that
    over any len(xs) consecutive buckets of a schedule it takes every one (a calling-context field,
    ``context.contexts``: each value meets a bucket in every run)."""
    xs = tuple(xs)
    k = (bucket.turn + _mix(bucket.cycle, salt)) % len(xs)
    return st.sampled_from(xs[k:] + xs[:k])


def integer(lo: int, hi: int, bucket: Bucket | None = None, salt: str = ""):
    """``integers(lo, hi)``; under a bucket, shrinking towards a spun value instead of lo (or 0)."""
    if bucket is None:
        return st.integers(lo, hi)
    span = hi - lo + 1
    k = _mix(bucket.spin, salt) % span
    return st.integers(0, span - 1).map(lambda i: lo + (i + k) % span)


