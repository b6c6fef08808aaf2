"""Argument kinds: one record per kind of argument an op takes.

An op's signature (``record.Op.args``) names each argument's kind; everything the suite does
with an argument it does through its ``Kind``, here and nowhere else:

    check     is a value acceptable?  ``check(op, name, value, main)`` raises ValueError naming
              the op and the argument (``validate``); the oracle, the replay loader and every
              kernel call's case go through it
    sample    the small ordinary value every consumer that needs one uses (the dtype probe,
              gradcheck, benchmarks): ``sample(normal, rows, width)``, ``normal(*shape)`` being
              standard normal float64
    draw      the Hypothesis draw: ``draw(d, arg)`` on the strategy module's ``Drawing`` ``d``,
              which owns the randomness (one numpy generator per case, the bucket's spins) and
              the value profiles; the kind says what to ask it for
    convert   the oracle's value on backend B: tensors exactly widened, the mask as numpy bools,
              scalars as Python floats (GELU's form as its name, a flag as a bool)
    identity  what an ``optional`` argument given as None means (a weight of ones, a bias of
              zeros); None: the kind may not be optional
    shape     how the value's shape follows the main tensor x (n = x.shape[-1]):
              "rows" x.shape (a *row input*: it shares x's rows); "leading" x.shape[:-1];
              "experts" x.shape[:-2] (one value per expert: a count of valid rows);
              "vector" (n,); "matrix" (n, n); None: a scalar.  ``properties.search.fitting`` reshapes by it,
              and a domain's ``params=`` casts the "vector" tensors (weight, bias, a sublayer's bias)
    may_be_none  None is a value of the kind (a mask: every position valid; scale_ub: no bound)

The kinds (the first row input of an op, of kind "rows", is its *main* tensor: its dtype, device and rows
define a case):

    rows     a tensor of the main tensor's shape and dtype
    stream   a residual stream: a tensor of the main tensor's shape, in its dtype or, for a
             float16 / bfloat16 main tensor, float32 (``residual_in_fp32``: training and
             state-space libraries keep the residual stream in float32; a domain's ``residual=``
             narrows it)
    weight   a length-n vector in the main dtype or float32, drawn around 1
    bias     a length-n vector in the main dtype or float32, drawn around 0
    matrix   an n x n matrix in the main dtype (a sublayer's weight), scaled by 1/sqrt(n)
    vector   a length-n vector in the main dtype or float32 (a sublayer's bias), drawn small
    mask     a bool tensor of shape x.shape[:-1], or None: the valid positions
    counts   an int32 / int64 tensor of shape x.shape[:-2]: x is (experts...,
             tokens, n) and expert e's valid rows are its first counts[e] (a masked MoE layout; the
             rows past them are padding, never read: ``record.Op.valid``), each count in [0, tokens],
             drawn with both ends
    eps      a positive finite float
    alpha    a finite float (DeepNorm's residual scale, (2N)^(1/4) for N layers)
    approximate  GELU's form, one of APPROXIMATE: "none" (erf) or "tanh"
    scale    a positive finite float: a static per-tensor quantisation scale (the output is
             divided by it before it is rounded to its quantised format)
    flag     True or False: a switch between two forms of the op (the gated norm's
             norm_before_gate), drawn both ways

The *contract kinds* are choices a kernel declares, not arguments it is passed: no ``call`` gives
them to a kernel, they are never drawn (a drawn case holds None, the default) and a kernel's domain
sets them (``properties.declared.domain``, ``properties.search.fitting``); the oracle and the bounds read them:

    nan      the NaN policy of every amax an op takes, one of ``dynamic_quant.NAN_POLICIES``:
             None or "propagate" (a NaN in a row, group or block makes its scale NaN) or "ignore"
             (IEEE maximumNumber: the amax of its non-NaN elements, Triton's ``tl.max``)
    scale_floor  a dynamic or group scale's floor (``dynamic_quant.read_floor``): None or "1/512q"
             (1 / (512 q), vLLM's) or "eps32" (float32's machine epsilon), or a value: "amax:a" (the
             amax floored at a, vLLM's and SGLang's Triton group quants' a = 1e-10) or "a" (the scale
             floored at a), a in its one spelling, Python's repr of float(a)
    tail     a per-group op's tail rule, one of ``dynamic_quant.TAILS``: None or "none" (the row a
             multiple of the group, else a ValueError naming the group) or "partial" (any row: the
             last group shorter, with its own scale; the group kind's divisor check is then not
             applied, ``record.Op.check``)
    mx_scale MXFP4's shared-exponent rule, one of ``fp4_scales.MX_SCALES``: None or "rceil"
             (2**ceil(log2 S), cuBLAS's), "floor" (OCP MX 1.0's 2**(floor(log2 amax) - 2)), "ceil" or
             "even" (torchao's); the formulas and their intervals are ``fp4_scales``'s
    block_floor  NVFP4's block-scale floor, one of ``fp4_scales.BLOCK_FLOORS``: None or "none" (E4M3
             of S as it is) or "2^-6" (S clamped to at least 2**-6 before the cast, torchao's)
    mx_global_scale  whether an MXFP4 kernel takes a global scale, one of
             ``fp4_scales.MX_GLOBAL_SCALES``: None or "none" (called with 1, as OCP MX has none) or
             "taken" (fitted a global scale from ``fp4.GLOBAL_SCALES``, applied as NVFP4's is)
    arithmetic  the kernel's square roots, divisions and reciprocals, one of ``lattice.ARITHMETICS``:
             None or "approximate" (good to FN_ULPS ulps, ``error_model``) or "ieee" (correctly
             rounded: on the rows ``lattice`` proves exact an FP4 y is checked bit for bit)
    intermediate  where an FP4 kernel holds v before its amax, one of ``fp4.INTERMEDIATES``: None or
             "float32" (the compute format, a fused kernel) or "input" (x's dtype, an unfused
             pipeline): a block whose v may overflow there has no claim (``bounds_quant.block``)
    qdtype   the name of the format an output is quantised to, one of ``dynamic_quant.QDTYPES``:
             "float8_e4m3fn" or "int8" (the output's dtype follows it: ``record.Out.dtype_arg``)
    scale_ub None (no bound) or a positive finite float: the largest row peak a dynamic scale is
             taken of (rows past it saturate)
    group    a positive integer dividing the row length: consecutive elements of a row that share
             a quantisation scale, one of GROUPS when drawn (the op's ``width_multiple`` makes
             every one of them divide the rows drawn); under tail=partial any positive integer
    scale_format  how a group's scale is stored, one of ``dynamic_quant.SCALE_FORMATS``: "float32"
             (as computed) or "ue8m0" (rounded up to a power of two, OCP MX)
    group_size  None (the whole row) or a positive integer dividing the row length: the gated norm's
             normalisation groups, group_size consecutive elements of a row sharing their statistics
             (Mamba-2's ``RMSNormGated(group_size=...)``).  Drawn as None or n / k, alike, for the
             group counts k > 1 of GROUP_COUNTS that divide n; where none does, None or n (given)
    layout   the memory layout of a per-group scale output, one of SCALE_LAYOUTS: "row_major" (a
             contiguous (rows, groups) tensor), "column_major" (the same shape, stored groups first)
             or "mn_major" (each matrix of the last two dims stored groups first: (E, T, G) with strides
             (T G, 1, T), DeepGEMM's masked MoE scales; column_major where the scales are 2-D).  Drawn
             from DRAWN_LAYOUTS: "mn_major" only where a kernel's domain declares it (``layouts=``)
    block_format  an FP4 block format, one of ``fp4.BLOCK_FORMATS``: "nvfp4" (block 16, E4M3 block
             scales) or "mxfp4" (block 32, UE8M0 block scales); its block must divide the row length
             (the op's ``width_multiple`` makes both divide every row drawn)
    global_scale  a positive finite float: an FP4 op's per-tensor scale (the block scales are of
             amax / (6 global_scale)); drawn from ``fp4.GLOBAL_SCALES`` (float32-exact values) for
             NVFP4, 1 for MXFP4 (OCP MX has none) unless the kernel declares mx_global_scale=taken
    block_layout  the memory layout of FP4 block scales, one of ``fp4.BLOCK_LAYOUTS``: "linear" (a
             contiguous (rows, n / block) tensor) or "swizzled" (the tensor cores' 128 x 4 tiles)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch

from . import validate as v
from .dynamic_quant import NAN_POLICIES, QDTYPES, SCALE_FLOORS, SCALE_FORMATS, TAILS, read_floor
from .formats import to_float64
from .fp4 import BLOCK_FORMATS, BLOCK_LAYOUTS, GLOBAL_SCALES, INTERMEDIATES
from .fp4_scales import BLOCK_FLOORS, MX_GLOBAL_SCALES, MX_SCALES
from .lattice import ARITHMETICS

APPROXIMATE = ("none", "tanh")
LAYERS = (1, 6, 12, 24, 100)  # DeepNorm depths drawn: alpha = (2N)^(1/4)
SCALE_UBS = (None, None, 0.5, 2.0, 16.0, 1000.0)
GROUPS = (32, 64, 128)  # DeepSeek's 1 x 128, vLLM's per-block 64 / 128, OCP MX's 32
GROUP_COUNTS = (1, 2, 4, 8)  # a gated norm's groups per row: Codestral Mamba and Nemotron-H run 8
SCALE_LAYOUTS = ("row_major", "column_major", "mn_major")
DRAWN_LAYOUTS = SCALE_LAYOUTS[:2]  # mn_major: only for a kernel that declares it (a domain's layouts=)


class Drawing(Protocol):
    """What a kind's ``draw`` may ask of the strategy module (``properties.search.strategies.Drawing``)."""

    n: int  # the main tensor's last dim
    sublayer_scale: float  # the factor on a sublayer's weights (1, or tiny under a near-constant bucket)

    def rows(self, name: str): ...  # a tensor of the case's shape, by value profile
    def stream(self, name: str): ...  # rows, in the case's dtype or float32
    def vector(self, name: str, around: float, profiles: tuple[str, ...]): ...  # length n
    def gaussian(self, shape: tuple, scale: float): ...  # N(0, scale^2), rounded to the case's dtype
    def mask(self, name: str): ...  # a mask (or None), padded positions of x overwritten
    def counts(self, name: str): ...  # valid rows per expert, the rows past them overwritten
    def eps(self) -> float: ...
    def quantisation_scale(self) -> float: ...
    def choose(self, xs, salt: str): ...  # one of xs
    scalars: dict  # the case's other arguments drawn so far, by name
    def note(self, name: str, text: str) -> None: ...  # what the case's notes say of the draw


@dataclass(frozen=True)
class Kind:
    name: str
    check: Callable[[str, str, object, object], None]
    sample: Callable[[Callable, int, int], object]
    draw: Callable[[Drawing, object], object]
    shape: str | None
    identity: float | None = None
    may_be_none: bool = False

    def __post_init__(self):
        if self.shape not in (None, "rows", "leading", "experts", "vector", "matrix"):
            raise ValueError(f"Kind {self.name}: shape must be rows, leading, experts, vector, matrix or None, "
                             f"got {self.shape!r}")

    @property
    def tensor(self) -> bool:
        return self.shape is not None

    def convert(self, B, value, n: int):
        """``value`` as backend B's argument; an optional one given as None is its identity."""
        if value is None and self.identity is not None:
            return B.array(np.full(n, self.identity))
        if self.shape == "leading":
            return None if value is None else value.detach().cpu().numpy().astype(bool)
        if self.shape == "experts":
            return None if value is None else value.detach().cpu().numpy().astype(np.int64)
        if self.tensor:
            return B.array(to_float64(value))
        if value is None:  # a scalar that may be None (scale_ub: no bound)
            return None
        return value if isinstance(value, (str, bool)) else float(value)


def _vector_kind(name: str, identity: float, spread: float, profiles: tuple[str, ...]) -> Kind:
    """weight / bias: length n, ``identity`` when None, drawn around it."""
    def draw(d, arg):
        if arg.optional and d.choose([False, False, True], arg.name + " None"):
            d.note(arg.name, "None")  # a weightless call
            return None
        return d.vector(name, identity, profiles)
    return Kind(name, check=lambda op, arg_name, t, x: v.vector(op, arg_name, t, x.shape[-1], x.dtype),
                sample=lambda normal, rows, width: identity + normal(width) * spread, draw=draw, shape="vector",
                identity=identity)


def _alpha(d, arg) -> float:
    layers = d.choose(list(LAYERS), "alpha")
    d.note(arg.name, f"(2N)^1/4, N={layers}")
    return float((2 * layers) ** 0.25)


def _row(x) -> int | None:
    """The row length a scalar's check holds it against: x's last dim, or None where no tensor is
    built yet (a replay file's scalars are checked before its tensors load; the built case is
    checked again, whole, by ``Op.check``)."""
    return None if x is None else x.shape[-1]


def _norm_group(d, arg) -> int | None:
    """None (the whole row) or n / k for a group count k > 1 of GROUP_COUNTS dividing n, alike; on a
    row no such k divides, None or n (the whole row, given)."""
    sizes = [d.n // k for k in GROUP_COUNTS if k > 1 and d.n and d.n % k == 0] or ([d.n] if d.n else [])
    size = d.choose([None] + sizes, arg.name)
    if size is not None:
        d.note(arg.name, f"{d.n // size} group(s) of {size}")
    return size


def _contract_kind(name: str, values: tuple[str, ...], check=None) -> Kind:
    """A contract choice (module docstring): None (the default, ``values[0]``) or one of ``values``
    (or, given ``check``, any value it accepts); sampled and drawn as None, set by a kernel's declared
    domain alone."""
    check = check or (lambda op, arg_name, value: v.one_of(op, arg_name, value, values))
    return Kind(name, check=lambda op, arg_name, value, x: value is None or check(op, arg_name, value),
                sample=lambda normal, rows, width: None, draw=lambda d, arg: None, shape=None, may_be_none=True)


def _floor(op: str, name: str, value) -> None:
    """A scale_floor in its one spelling (``dynamic_quant.read_floor``), else the one-line ValueError."""
    try:
        spelt = read_floor(value)
    except ValueError:
        spelt = None
    if spelt != value:
        v.expected(op, name, f"one of {', '.join(map(repr, SCALE_FLOORS))}, 'amax:A' or 'A' (A a positive number "
                            f"as Python's repr of a float)", repr(value))


def _global_scale(d, arg) -> float:
    """One of ``fp4.GLOBAL_SCALES`` where the case's block format has a global scale (NVFP4), 1 where
    it has none (MXFP4: OCP MX defines no per-tensor scale; a kernel that takes one declares
    mx_global_scale=taken and is fitted one, ``properties.search.fitting``)."""
    if d.scalars.get("block_format") == "mxfp4":
        return 1.0
    return d.choose(list(GLOBAL_SCALES), arg.name)


def _scalar_check(check: Callable) -> Callable:
    return lambda op, name, value, x: check(op, name, value)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("rows", check=lambda op, name, t, x: v.same_as(op, name, t, x),
         sample=lambda normal, rows, width: normal(rows, width),
         draw=lambda d, arg: d.rows(arg.name), shape="rows"),
    Kind("stream", check=lambda op, name, t, x: v.stream(op, name, t, x),
         sample=lambda normal, rows, width: normal(rows, width),
         draw=lambda d, arg: d.stream(arg.name), shape="rows"),
    _vector_kind("weight", 1.0, 1 / 4, ("ones", "normal", "lattice")),
    _vector_kind("bias", 0.0, 1 / 4, ("zeros", "normal")),
    Kind("matrix", check=lambda op, name, t, x: v.square(op, name, t, x.shape[-1], x.dtype),
         sample=lambda normal, rows, width: normal(width, width) / math.sqrt(width),
         draw=lambda d, arg: d.gaussian((d.n, d.n), d.sublayer_scale / math.sqrt(d.n)), shape="matrix"),
    Kind("vector", check=lambda op, name, t, x: v.vector(op, name, t, x.shape[-1], x.dtype),
         sample=lambda normal, rows, width: normal(width) / 10,
         draw=lambda d, arg: d.gaussian((d.n,), 0.1 * d.sublayer_scale), shape="vector"),
    Kind("mask", check=lambda op, name, t, x: v.mask(op, t, x),
         sample=lambda normal, rows, width: None,
         draw=lambda d, arg: d.mask(arg.name), shape="leading", may_be_none=True),
    Kind("counts", check=lambda op, name, t, x: v.counts(op, name, t, x),
         sample=lambda normal, rows, width: torch.tensor(rows),  # x (rows, width): one expert, all valid
         draw=lambda d, arg: d.counts(arg.name), shape="experts"),
    Kind("eps", check=_scalar_check(v.positive),
         sample=lambda normal, rows, width: 1e-5,
         draw=lambda d, arg: d.eps(), shape=None),
    Kind("alpha", check=_scalar_check(v.finite),
         sample=lambda normal, rows, width: 2.0,
         draw=_alpha, shape=None),
    Kind("approximate", check=lambda op, name, value, x: v.one_of(op, name, value, APPROXIMATE),
         sample=lambda normal, rows, width: "none",
         draw=lambda d, arg: d.choose(APPROXIMATE, "approximate"), shape=None),
    Kind("scale", check=_scalar_check(v.positive),
         sample=lambda normal, rows, width: 1 / 64,
         draw=lambda d, arg: d.quantisation_scale(), shape=None),
    Kind("qdtype", check=lambda op, name, value, x: v.one_of(op, name, value, tuple(QDTYPES)),
         sample=lambda normal, rows, width: "float8_e4m3fn",
         draw=lambda d, arg: d.choose(list(QDTYPES), arg.name), shape=None),
    Kind("scale_ub", check=lambda op, name, value, x: value is None or v.positive(op, name, value),
         sample=lambda normal, rows, width: None,
         draw=lambda d, arg: d.choose(list(SCALE_UBS), arg.name), shape=None, may_be_none=True),
    Kind("group", check=lambda op, name, value, x: v.group_size(op, name, value, _row(x)),
         sample=lambda normal, rows, width: GROUPS[0],
         draw=lambda d, arg: d.choose(list(GROUPS), arg.name), shape=None),
    Kind("group_size", check=lambda op, name, value, x: value is None or v.group_size(op, name, value, _row(x)),
         sample=lambda normal, rows, width: None,
         draw=_norm_group, shape=None, may_be_none=True),
    Kind("scale_format", check=lambda op, name, value, x: v.one_of(op, name, value, SCALE_FORMATS),
         sample=lambda normal, rows, width: "float32",
         draw=lambda d, arg: d.choose(list(SCALE_FORMATS), arg.name), shape=None),
    Kind("layout", check=lambda op, name, value, x: v.one_of(op, name, value, SCALE_LAYOUTS),
         sample=lambda normal, rows, width: "row_major",
         draw=lambda d, arg: d.choose(list(DRAWN_LAYOUTS), arg.name), shape=None),
    Kind("block_format", check=lambda op, name, value, x: v.block_format(op, name, value, _row(x), BLOCK_FORMATS),
         sample=lambda normal, rows, width: "nvfp4",
         draw=lambda d, arg: d.choose(list(BLOCK_FORMATS), arg.name), shape=None),
    Kind("global_scale", check=_scalar_check(v.positive),
         sample=lambda normal, rows, width: 1.0,
         draw=_global_scale, shape=None),
    Kind("block_layout", check=lambda op, name, value, x: v.one_of(op, name, value, BLOCK_LAYOUTS),
         sample=lambda normal, rows, width: "linear",
         draw=lambda d, arg: d.choose(list(BLOCK_LAYOUTS), arg.name), shape=None),
    Kind("flag", check=_scalar_check(v.boolean),
         sample=lambda normal, rows, width: False,
         draw=lambda d, arg: d.choose([False, True], arg.name), shape=None),
    _contract_kind("nan", NAN_POLICIES),
    _contract_kind("scale_floor", SCALE_FLOORS, _floor),
    _contract_kind("tail", TAILS),
    _contract_kind("mx_scale", MX_SCALES),
    _contract_kind("block_floor", BLOCK_FLOORS),
    _contract_kind("mx_global_scale", MX_GLOBAL_SCALES),
    _contract_kind("arithmetic", ARITHMETICS),
    _contract_kind("intermediate", INTERMEDIATES),
)}
