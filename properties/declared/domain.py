"""A kernel's declared domain: the inputs it supports, stated up front.

A kernel that supports only part of an op says so, instead of raising
NotImplementedError on what it does not support (a refusal would double as a
way to dodge the cases it gets wrong).  The suite then draws only cases inside
the domain, any refusal inside it is a failure, and the certificate says
"certified on: <the restrictions>".

Declared as an attribute on the kernel, ``kernel.normcert_domain``, or with
``--domain`` on the command line (which replaces the attribute), as a string of
``key=value`` items separated by spaces or semicolons, or (the attribute) a dict
of the same keys.  The domain is normcert's own record, read from that text
(``parse``): an object the kernel built (a ``Domain``, a subclass of one, a str
subclass) is refused, since its methods would be the kernel's code saying what
was certified.

    dtypes=float16,bfloat16   the main tensor's dtypes (default: all four)
    params=same|float32       weight, bias and a sublayer's bias: in x's dtype,
                              or float32 (default: either; a sublayer's matrix is in x's)
    residual=same|float32     a fused op's residual stream (and so its residual_out): in
                              x's dtype, or float32 where x is float16 / bfloat16
                              (residual_in_fp32; default: either)
    max_width=8192            the main tensor's last dim (for the *_and_mul ops the
                              [gate | up] row, twice the output's) is at most this
    width_multiple=8          ... and a multiple of this
    contiguous=last|all       last: every tensor's last dim has stride 1 (no
                              transposed rows, no strided weight); all: every tensor
                              contiguous
    ranks=2,3                 the main tensor's rank is one of these (2..4)
    weightless=yes|no         an optional weight or bias may be None (yes: it must be
                              taken; no: never passed; default: asked once)
    flags=NAME:yes|no,...     a flag argument (kind "flag") the kernel supports one value
                              of: norm_before_gate:yes for a gated norm that gates after the
                              norm only (flash-linear-attention's FusedRMSNormGated).  Its cases
                              are drawn, then fitted to that value; NAME must be a flag of the
                              kernel's op (checked when the kernel is registered)
    unsupported=group_size    options of the op (``oracle.record.Arg.option``: arguments an op gained
                              after its first contract, passed by keyword only where a case gives
                              them) the kernel does not take: its cases are those without them (fitted
                              to None, the option absent).  A kernel whose signature has no parameter
                              of that name (and no **kwargs) has it added when it is registered
                              (``properties.declared.signature``), so a kernel certified before the
                              option existed stays certified, its domain saying "group_size not
                              supported"; NAME must be an option of the kernel's op (checked when the
                              kernel is registered)
    capturable=yes|no         yes: the kernel can be captured in a CUDA graph, and a capture
                              that fails fails its served result; no: it is not captured
                              (default: tried, and a failed capture is noted, not failed).
                              No case is fitted for it: it is a claim about the call
    nan=propagate|ignore|unspecified  the NaN policy of the op's amax (a contract choice, argument kind "nan",
                              ``oracle.dynamic_quant``): propagate (the default) makes a scale NaN
                              where its row, group or block holds a NaN; ignore takes the amax over
                              the non-NaN elements (IEEE maximumNumber, Triton's tl.max); unspecified
                              makes no claim on a row, group or block holding a NaN (its scale and
                              values unchecked; every other one checked as under propagate).  Only an
                              op that takes an amax (the dynamic, group and FP4 quants) has one: on
                              another op the key is an error (checked when the kernel is registered)
    scale_floor=1/512q|eps32|F  the floor of a dynamic or group scale (a contract choice, argument kind
                              "scale_floor", ``oracle.dynamic_quant``): 1/(512 q) (the default, vLLM's
                              min_scaling_factor), float32's machine epsilon 2**-23 (some int8 paths),
                              or a positive number F: scale = max(amax / q, F); only the dynamic and
                              group quants have one (FP4's block scale has none)
    amax_floor=A              the same choice stated on the amax: scale = max(amax, A) / q, i.e. the
                              floor A / q (vLLM's per_token_group_quant_fp8 and SGLang's masked
                              silu_and_mul quant: amax_floor=1e-10); A is taken as the float32 the
                              kernel holds it in.  Not with scale_floor=
    groups=128                the group sizes (argument kind "group") the kernel supports, some of
                              32,64,128 (vLLM's per_token_group_quant_fp8 asserts 128): a case drawn
                              with another is fitted to one of these
    approximate=tanh          the GELU forms (argument kind "approximate", torch's spelling) the kernel
                              computes, some of none (erf), tanh: Liger's GeGLU computes tanh only.  A
                              case drawn with another is fitted to one of these
    layouts=mn_major          the scale layouts (kinds "layout", "block_layout") the kernel writes, some
                              of row_major,column_major,mn_major (DeepGEMM's masked MoE scales, drawn
                              only where declared) and linear,swizzled: a case is fitted to one of them
    block_formats=nvfp4       the FP4 block formats (kind "block_format") the kernel supports, some of
                              nvfp4,mxfp4: a case drawn with another is fitted to one of these
    tail=none|partial         a per-group quant's tail rule (a contract choice, argument kind "tail"):
                              none (the default) requires rows a multiple of the group; partial
                              admits a last group shorter than the group, with its own scale from
                              its own amax, and the kernel is then fitted rows that are not a
                              multiple of it (``Domain.width``, ``properties.search.fitting``).  Only the
                              group quants have one
    mx_scale=rceil|floor|ceil|even  MXFP4's shared-exponent rule (a contract choice, argument kind
                              "mx_scale", ``oracle.fp4_scales``): rceil (the default, cuBLAS's
                              2**ceil(log2(amax / 6))), floor (OCP MX 1.0 section 6.3's
                              2**(floor(log2 amax) - 2), elements saturating at 6), ceil or even
                              (torchao's).  Only the FP4 ops have one; it rules their mxfp4 blocks
    block_floor=none|2^-6     NVFP4's block-scale floor (a contract choice, argument kind
                              "block_floor"): none (the default) or 2^-6, the scale clamped to at
                              least E4M3's smallest normal before its cast (torchao's nvfp4_quantize)
    mx_global_scale=none|taken  an MXFP4 kernel's global scale (a contract choice): none (the
                              default: OCP MX has none, MXFP4 cases are drawn with global_scale 1) or
                              taken (MXFP4 cases fitted a global scale of ``fp4.GLOBAL_SCALES``, spun
                              from the case's seed, applied as NVFP4's: ``properties.search.fitting``)
    autocast=keeps|casts      the output dtype inside ``torch.autocast`` (a contract choice of the call,
                              no argument of the op): keeps (the default) returns the dtype the op's
                              contract states (float32 for float32 inputs, as a float32-accurate
                              result); casts follows apex's and timm's ``fused_rms_norm_affine``: the
                              floating inputs cast to the autocast dtype (bfloat16), float32 statistics,
                              the outputs in the autocast dtype, held to the oracle (and bound) of the
                              inputs cast to it, their gradients to that case's VJP.  Outputs in the
                              contract's dtype are still accepted and held to the float32 oracle.  Only
                              an op with a backward has one (autocast meets a training step's kernels:
                              ``properties.harness.calling``, ``properties.search.modes``)
    dy=kept|overwritten       what the backward does with autograd's incoming gradient (a contract choice
                              of the call, no argument of the op): kept (the default) leaves it as given,
                              since autograd may hand the same tensor to another use's backward;
                              overwritten admits a backward that writes its gradient over dy (Liger's
                              RMSNorm in_place=True, which saves a buffer where dy is used once), its
                              gradients held to the VJP of the dy it was handed.  It must still take a
                              dy it cannot write over (expanded, as y.sum().backward() hands over).
                              Only an op with a backward has one
    arithmetic=approximate|ieee  the kernel's square roots, divisions and reciprocals (a contract
                              choice, ``oracle.lattice``): approximate (the default, good to FN_ULPS
                              ulps, as rsqrt.approx and rcp.approx) or ieee (correctly rounded: on the
                              rows the oracle proves exact an FP4 kernel's y is checked bit for bit, so
                              an E2M1 tie is decided).  Only the FP4 ops have one
    intermediate=float32|input  where the kernel holds v before its block amax (a contract choice,
                              ``oracle.bounds_quant.block``): float32 (the default, a fused kernel: the
                              compute format, float64 for float64 inputs) or input (an unfused
                              pipeline materialising v in x's dtype first, vLLM's silu_and_mul then
                              its FP4 quant): a block whose v may overflow that format has no claim,
                              so a float16 v past 65504 is claimed under float32 alone.  Only the FP4
                              ops have one

A case is drawn as for any kernel, then *fitted* into the domain
(``properties.search.fitting``): the row length rounded up to the multiple (cut short of a
whole group first under tail=partial; capped at
the maximum), leading dims flattened or unsqueezed to an allowed rank, tensors
made contiguous, weights cast, None weights replaced by ones / zeros, an option the
kernel does not take removed; its notes say what was fitted.

A fitted case is at most ``MAX_FITTED_ELEMENTS`` elements: a domain whose largest
fitted case is larger cannot be built, and is a usage error before any case
(``check_size``); so is one no row of the op fits (``check_fits``: max_width below the
op's shortest row, e.g. max_width=100 for a group quant, whose rows are multiples of 128, or
max_width=1 for silu_and_mul, whose rows are [gate | up]), whose every case would hold 0
elements.  ``check_op`` makes every check of a domain against an op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ...oracle import OPS
from ...oracle.dynamic_quant import NAN_POLICIES, SCALE_FLOORS, TAILS, read_floor
from ...oracle.formats import DTYPE_NAMES
from ...oracle.fp4 import BLOCK_FORMATS, BLOCK_LAYOUTS, INTERMEDIATES
from ...oracle.kinds import APPROXIMATE, GROUPS, SCALE_LAYOUTS
from ...oracle.fp4_scales import BLOCK_FLOORS, MX_GLOBAL_SCALES, MX_SCALES
from ...oracle.lattice import ARITHMETICS

MANY_ROWS = 65537
"""The most rows a drawn case has: the search's "many" bucket, past 2**16 rows (grid and block-count
limits, apex#411; ``properties.search.buckets``).  Declared here, below the search,
because the registry's record checks a domain's largest fitted case against it (``check_size``)."""

MAX_FITTED_ELEMENTS = 1 << 27
"""The most elements the main tensor of a fitted case may hold: 512 MiB in float32, 1 GiB as the
oracle's float64 copy, of which a case holds a few (inputs, outputs, gradients) per xdist worker.
Fitting grows a case only by widening its rows, so the largest fitted case is the one with the most
rows, the "many" bucket (``MANY_ROWS`` = 65537 rows), each row widened to the
narrowest row the domain admits (``Domain.width(1)``): a width_multiple of up to 2047 fits (2046 for a
[gate | up] op, whose rows are even; less for a per-group op whose groups do not divide it)."""

KEYS = ("dtypes", "params", "residual", "max_width", "width_multiple", "contiguous", "ranks", "weightless", "flags",
        "unsupported", "capturable", "nan", "scale_floor", "tail", "amax_floor", "groups", "approximate", "layouts",
        "block_formats",
        "mx_scale", "block_floor", "mx_global_scale", "arithmetic", "intermediate", "autocast", "dy")
ARG_KEYS = {"groups": ("group",), "approximate": ("approximate",), "layouts": ("layout", "block_layout"),
            "block_formats": ("block_format",)}
"""The keys restricting an argument's drawn values to some of its kind's: key -> the argument kinds."""
CONTRACT = {"nan": NAN_POLICIES, "scale_floor": SCALE_FLOORS, "tail": TAILS, "mx_scale": MX_SCALES,
            "block_floor": BLOCK_FLOORS, "mx_global_scale": MX_GLOBAL_SCALES, "arithmetic": ARITHMETICS,
            "intermediate": INTERMEDIATES}  # the contract choices: key = the argument kind it sets, and its values
RANKS = (2, 3, 4)


class DomainError(ValueError):
    """A domain that cannot be read; the message is one line naming the key."""


@dataclass(frozen=True)
class Domain:
    """The declared domain; every field None (or 1 for ``width_multiple``) means unrestricted."""

    dtypes: tuple[str, ...] | None = None
    params: str | None = None  # "same" | "float32"
    residual: str | None = None  # "same" | "float32"
    max_width: int | None = None
    width_multiple: int = 1
    contiguous: str | None = None  # "last" | "all"
    ranks: tuple[int, ...] | None = None
    weightless: bool | None = None
    flags: tuple[tuple[str, bool], ...] | None = None  # (argument, its one supported value), sorted by name
    unsupported: tuple[str, ...] | None = None  # the op's options the kernel does not take, sorted
    capturable: bool | None = None  # a CUDA-graph capture that fails: gates (yes), not tried (no), noted (None)
    nan: str | None = None  # "propagate" | "ignore" | "unspecified": the amax's NaN policy (a contract choice)
    scale_floor: str | None = None  # "1/512q" | "eps32" | a number's repr: a dynamic scale's floor (a contract choice)
    tail: str | None = None  # "none" | "partial": a per-group quant's last group (a contract choice)
    amax_floor: str | None = None  # a number's repr: the same choice as the amax's floor (kind "scale_floor")
    groups: tuple[int, ...] | None = None  # the group sizes supported (kind "group")
    approximate: tuple[str, ...] | None = None  # the GELU forms computed (kind "approximate": "none", "tanh")
    layouts: tuple[str, ...] | None = None  # the scale layouts written (kinds "layout", "block_layout")
    block_formats: tuple[str, ...] | None = None  # the FP4 block formats supported (kind "block_format")
    mx_scale: str | None = None  # MXFP4's shared-exponent rule, ``fp4_scales.MX_SCALES`` (a contract choice)
    block_floor: str | None = None  # NVFP4's block-scale floor, ``fp4_scales.BLOCK_FLOORS`` (a contract choice)
    mx_global_scale: str | None = None  # "none" | "taken": an MXFP4 kernel's global scale (a contract choice)
    arithmetic: str | None = None  # "approximate" | "ieee": its divisions and square roots (a contract choice)
    intermediate: str | None = None  # "float32" | "input": where an FP4 kernel holds v (a contract choice)
    autocast: str | None = None  # "keeps" | "casts": its outputs' dtype inside autocast (a contract choice of the call)
    dy: str | None = None  # "kept" | "overwritten": its backward's writes into dy (a contract choice of the call)

    def arg_values(self) -> dict:
        """The values each key of ``ARG_KEYS`` admits (None: every drawn one)."""
        return {"groups": self.groups, "approximate": self.approximate, "layouts": self.layouts,
                "block_formats": self.block_formats}

    def allowed(self, kind: str) -> tuple | None:
        """The values of argument kind ``kind`` the domain admits (``ARG_KEYS``), None for all drawn."""
        for key, kinds in ARG_KEYS.items():
            values = self.arg_values()[key]
            if kind in kinds and values is not None:
                return tuple(v for v in values if v in ARG_VALUES[kind]) or None
        return None

    def choices(self) -> dict[str, str]:
        """The contract choices declared (``CONTRACT``): argument kind -> its value (an amax_floor A
        as the scale_floor "amax:A", ``oracle.dynamic_quant.read_floor``)."""
        floor = "amax:" + self.amax_floor if self.amax_floor is not None else self.scale_floor
        every = {"nan": self.nan, "scale_floor": floor, "tail": self.tail, "mx_scale": self.mx_scale,
                 "block_floor": self.block_floor, "mx_global_scale": self.mx_global_scale, "arithmetic": self.arithmetic,
                 "intermediate": self.intermediate}
        return {key: value for key, value in every.items() if value is not None}

    @property
    def declared(self) -> bool:
        return self != Domain()

    def admits_dtype(self, dtype_name: str) -> bool:
        return self.dtypes is None or dtype_name in self.dtypes

    def width(self, n: int, halves: bool = False, op_multiple: int = 1) -> int:
        """The row length a case of length ``n`` is fitted to: n rounded up to the multiple (and to
        an even length for a halves op, to a multiple of the op's own ``op_multiple`` for a
        per-group op, unless the domain declares tail=partial: its groups need not divide a row),
        capped at the largest such length <= max_width."""
        op_multiple = 1 if self.tail == "partial" else op_multiple
        step = math.lcm(self.width_multiple, op_multiple * (2 if halves else 1))  # op_multiple: of output rows
        step *= 2 if halves and step % 2 else 1
        fitted = max(step, -(-n // step) * step)
        if self.max_width is not None:
            fitted = min(fitted, self.max_width // step * step)
        return fitted

    def rank(self, r: int) -> int:
        """The rank a case of rank ``r`` is fitted to: r if allowed, else the next allowed rank
        above it, else the largest allowed."""
        if self.ranks is None or r in self.ranks:
            return r
        above = [k for k in self.ranks if k > r]
        return min(above) if above else max(self.ranks)

    def describe(self) -> str:
        """The restrictions in words, "" when none is declared."""
        parts = []
        if self.dtypes is not None:
            parts.append("dtypes " + ", ".join(self.dtypes))
        if self.params is not None:
            parts.append("weights in x's dtype" if self.params == "same" else "weights in float32")
        if self.residual is not None:
            parts.append("residual stream in x's dtype" if self.residual == "same"
                         else "residual stream in float32 (for float16 / bfloat16 x)")
        if self.width_multiple > 1 or self.max_width is not None:
            parts.append("row length" + (f" a multiple of {self.width_multiple}" if self.width_multiple > 1 else "")
                         + (" and" if self.width_multiple > 1 and self.max_width is not None else "")
                         + (f" at most {self.max_width}" if self.max_width is not None else ""))
        if self.contiguous is not None:
            parts.append("contiguous tensors" if self.contiguous == "all" else "last dim contiguous (stride 1)")
        if self.ranks is not None:
            parts.append("rank " + " or ".join(map(str, self.ranks)))
        if self.weightless is not None:
            parts.append("weightless calls (None weight / bias)" if self.weightless else "no weightless calls")
        if self.flags is not None:
            parts += [f"{name}={'yes' if value else 'no'}" for name, value in self.flags]
        parts += [f"{name} not supported" for name in self.unsupported or ()]
        if self.capturable is not None:
            parts.append("capturable=yes (a failed CUDA-graph capture fails; captured on a GPU only)" if self.capturable
                         else "capturable=no (never captured in a CUDA graph)")
        words = {"groups": "group sizes", "approximate": "GELU forms", "layouts": "scale layouts",
                 "block_formats": "block formats"}
        parts += [f"{words[key]} {', '.join(map(str, values))}" for key, values in self.arg_values().items()
                  if values is not None]
        parts += [said(key, value) for key, value in self.choices().items()]
        if self.autocast is not None:
            parts.append("autocast=casts (inside autocast: outputs in bfloat16, held to the oracle of the inputs "
                         "cast to it)" if self.autocast == "casts" else "autocast=keeps")
        if self.dy is not None:
            parts.append("dy=overwritten (its backward writes over the incoming gradient)" if self.dy == "overwritten"
                         else "dy=kept")
        return "; ".join(parts)

    def spec(self) -> str:
        """The domain in the syntax ``parse`` reads (a replay file and a certificate carry it)."""
        items = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "width_multiple" and value == 1):
                continue
            if f.name == "flags":
                value = ",".join(f"{name}:{'yes' if v else 'no'}" for name, v in value)
            elif isinstance(value, tuple):
                value = ",".join(map(str, value))
            elif isinstance(value, bool):
                value = "yes" if value else "no"
            items.append(f"{f.name}={value}")
        return " ".join(items)


def said(key: str, value: str) -> str:
    """A contract choice as a domain declares it: KEY=VALUE, a scale_floor "amax:A" as amax_floor=A."""
    return f"amax_floor={value[5:]}" if key == "scale_floor" and value.startswith("amax:") else f"{key}={value}"


def check_op(domain: Domain, rec, where: str) -> None:
    """DomainError unless ``domain`` is one a kernel of op record ``rec`` can be checked on: some row
    of the op lies in it (``check_fits``), its largest fitted case fits (``check_size``, on the
    search's ``MANY_ROWS``), and its flags and contract choices are the op's (``check_flags``,
    ``check_contract``), and the options it declares unsupported are the op's (``check_options``).
    ``where`` names the domain's source in the message: ``--domain``, the kernel's
    ``normcert_domain``, or its registry entry."""
    check_options(domain, rec, where)
    check_fits(domain, rec, where)
    check_size(domain, rec, MANY_ROWS, where)
    check_flags(domain, rec, where)
    check_contract(domain, rec, where)
    check_args(domain, rec, where)


def check_args(domain: Domain, rec, where: str) -> None:
    """DomainError unless every key of ``ARG_KEYS`` the domain gives names values of an argument op
    record ``rec`` takes (groups=128 for an op with a group, layouts= one of its layout kind's)."""
    kinds = {a.kind for a in rec.args}
    for key, of in ARG_KEYS.items():
        values = domain.arg_values()[key]
        if values is None:
            continue
        ours = [v for kind in of if kind in kinds for v in ARG_VALUES[kind]]
        if not any(v in ours for v in values):
            raise DomainError(f"{where}: {key}={','.join(map(str, values))}: {rec.name} takes no such argument value "
                              f"(its values: {', '.join(map(str, ours)) or 'none'})")


def check_fits(domain: Domain, rec, where: str) -> None:
    """DomainError unless a row of op record ``rec`` lies in ``domain``:

        domain.width(1, rec.halves, rec.width_multiple) >= 1

    i.e. max_width >= s, s = lcm(width_multiple, g (2 for a [gate | up] op)) the shortest row both
    admit, g the op's group multiple (1 under tail=partial).  Where it fails every case would be
    fitted to rows of 0 elements, and every check would pass on nothing."""
    if domain.width(1, rec.halves, rec.width_multiple) >= 1:
        return
    shortest = replace(domain, max_width=None).width(1, rec.halves, rec.width_multiple)
    why = []
    if rec.width_multiple > 1 and domain.tail != "partial":
        why.append(f"its output rows are multiples of {rec.width_multiple}, the largest group it is drawn with")
    if rec.halves:
        why.append("its rows are [gate | up], twice the output row")
    if domain.width_multiple > 1:
        why.append(f"width_multiple={domain.width_multiple}")
    tail = any(a.kind == "tail" for a in rec.args) and domain.tail != "partial"
    raise DomainError(f"{where}: max_width={domain.max_width}: no row of {rec.name} is that short, every case would "
                      f"be fitted to 0 elements: its shortest row is {shortest} ({'; '.join(why)})"
                      + ("; tail=partial admits rows that are not a multiple of the group" if tail else ""))


def check_size(domain: Domain, rec, rows: int, where: str) -> None:
    """DomainError unless the largest case fitted into ``domain`` for op record ``rec`` (``rows``
    rows of the narrowest row the domain admits for the op) holds at most MAX_FITTED_ELEMENTS."""
    width = domain.width(1, rec.halves, rec.width_multiple)
    if rows * width <= MAX_FITTED_ELEMENTS:
        return
    most = max(m for m in range(1, MAX_FITTED_ELEMENTS // rows + 1)  # only width_multiple widens a row
               if rows * Domain(width_multiple=m).width(1, rec.halves, rec.width_multiple) <= MAX_FITTED_ELEMENTS)
    raise DomainError(f"{where}: width_multiple={domain.width_multiple} fits {rec.name}'s largest case ({rows} rows) "
                      f"to rows of {width}, {rows * width} elements, past normcert's limit of {MAX_FITTED_ELEMENTS} "
                      f"elements (for {rec.name}: width_multiple at most {most})")


def check_flags(domain: Domain, rec, where: str) -> None:
    """DomainError unless every flag ``domain`` fixes is an argument of kind "flag" of op record ``rec``."""
    ours = [a.name for a in rec.args if a.kind == "flag"]
    for name, value in domain.flags or ():
        if name not in ours:
            raise DomainError(f"{where}: flags={name}:{'yes' if value else 'no'}: {name} is not a flag argument of "
                              f"{rec.name} (its flags: {', '.join(ours) or 'none'})")


def check_options(domain: Domain, rec, where: str) -> None:
    """DomainError unless every name ``domain`` declares unsupported is an option of op record ``rec``."""
    for name in domain.unsupported or ():
        if name not in rec.options:
            raise DomainError(f"{where}: unsupported={name}: {name} is not an option of {rec.name} (its options: "
                              f"{', '.join(rec.options) or 'none'})")


def without(domain: Domain, options) -> Domain:
    """``domain`` with ``options`` added to those it declares unsupported (itself where none is new)."""
    names = tuple(sorted({*(domain.unsupported or ()), *options}))
    return domain if names == (domain.unsupported or ()) else replace(domain, unsupported=names)


def check_contract(domain: Domain, rec, where: str) -> None:
    """DomainError unless every contract choice ``domain`` declares (``CONTRACT``) is one op record
    ``rec`` makes: it has an argument of that kind (an op without an amax has no NaN policy, one
    without a floored scale no scale_floor)."""
    kinds = {a.kind for a in rec.args}
    if domain.autocast is not None and not rec.grads:
        raise DomainError(f"{where}: autocast={domain.autocast}: {rec.name} has no backward, and autocast meets only "
                          f"the kernels of a training step (the ops with one: "
                          f"{', '.join(name for name, op in OPS.items() if op.grads)})")
    if domain.dy is not None and not rec.grads:
        raise DomainError(f"{where}: dy={domain.dy}: {rec.name} has no backward, so no incoming gradient")
    for key, value in domain.choices().items():
        if key not in kinds:
            makes = [name for name, op in OPS.items() if any(a.kind == key for a in op.args)]
            raise DomainError(f"{where}: {said(key, value)}: {rec.name} has no {key} choice to declare (the ops "
                              f"that have one: {', '.join(makes)})")


def parse(spec, where: str = "--domain") -> Domain:
    """A Domain from ``spec``: a string of key=value items (spaces or semicolons between them), a
    dict of the same keys (values: strings, whole numbers, booleans, or lists / tuples of strings
    and whole numbers), or None (unrestricted); nothing else, a Domain included.  ``where`` names
    the source in errors."""
    if spec is None:
        return Domain()
    if isinstance(spec, Domain):
        raise DomainError(f"{where}: a {type(spec).__name__} object is not accepted (normcert reads a domain only "
                          f"from its own text): give a string of KEY=VALUE items or a dict")
    if type(spec) is str:
        items = {}
        for item in spec.replace(";", " ").split():
            key, sep, value = item.partition("=")
            if not sep or not value:
                raise DomainError(f"{where} {spec!r}: {item!r} must look like KEY=VALUE (keys: {', '.join(KEYS)})")
            if key in items:
                raise DomainError(f"{where} {spec!r}: {key} given twice")
            items[key] = value
    elif type(spec) is dict:
        items = dict(spec)
        odd = [k for k, v in items.items() if type(k) is not str or not _plain(v)]
        if odd:
            raise DomainError(f"{where}: {odd[0]!r}: expected string keys and values that are strings, whole numbers, "
                              f"booleans or lists of those")
    else:
        raise DomainError(f"{where}: expected a string of KEY=VALUE items or a dict, got {type(spec).__name__}")
    unknown = [k for k in items if k not in KEYS]
    if unknown:
        raise DomainError(f"{where}: unknown key {unknown[0]!r}, expected one of {', '.join(KEYS)}")
    kw = {k: _READ[k](where, k, v) for k, v in items.items()}
    if "scale_floor" in kw and "amax_floor" in kw:
        raise DomainError(f"{where}: scale_floor and amax_floor given together: they state one floor, give one")
    domain = Domain(**kw)
    step = domain.width_multiple
    if domain.max_width is not None and domain.max_width < step:
        raise DomainError(f"{where}: max_width={domain.max_width} is below width_multiple={step}: no row fits")
    return domain


def _plain(value) -> bool:
    """A value a dict domain may hold: a str, int or bool, or a list / tuple of str and int (exact types:
    a subclass could answer ``==`` and ``str`` as it likes)."""
    if type(value) in (list, tuple):
        return all(type(v) in (str, int) for v in value)
    return type(value) in (str, int, bool)


def _names(value) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(v).strip() for v in items if str(v).strip()]


def _option_names(where, key, value) -> tuple[str, ...]:
    """Names of options, comma-separated (or a list of them), each an identifier, sorted."""
    names = _names(value)
    if not names or any(not n.isidentifier() for n in names):
        raise DomainError(f"{where}: {key}={value!r}: expected the names of options, comma-separated "
                          f"(e.g. unsupported=group_size)")
    return tuple(sorted(set(names)))


def _dtypes(where, key, value) -> tuple[str, ...]:
    names = _names(value)
    known = list(DTYPE_NAMES.values())
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise DomainError(f"{where}: {key}={value!r}: expected some of {', '.join(known)}, comma-separated")
    return tuple(sorted(set(names), key=known.index))


def _choice(*allowed):
    def read(where, key, value):
        if value not in allowed:
            raise DomainError(f"{where}: {key}={value!r}: expected one of {', '.join(allowed)}")
        return value
    return read


def _positive(where, key, value) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or str(n) != str(value).strip():
        raise DomainError(f"{where}: {key}={value!r}: expected a whole number >= 1")
    return n


def _ranks(where, key, value) -> tuple[int, ...]:
    try:
        ranks = sorted({int(r) for r in _names(value)})
    except ValueError:
        ranks = []
    if not ranks or any(r not in RANKS for r in ranks):
        raise DomainError(f"{where}: {key}={value!r}: expected some of {', '.join(map(str, RANKS))}, comma-separated")
    return tuple(ranks)


def _yes_no(where, key, value) -> bool:
    words = {"yes": True, "no": False, True: True, False: False}
    if value not in words:
        raise DomainError(f"{where}: {key}={value!r}: expected yes or no")
    return words[value]


def _flags(where, key, value) -> tuple[tuple[str, bool], ...]:
    """NAME:yes|no items, comma-separated (or a list of them): each flag's one supported value."""
    words = {"yes": True, "no": False}
    read = {}
    for item in _names(value):
        name, sep, word = item.partition(":")
        if not sep or not name or word not in words:
            raise DomainError(f"{where}: {key}={value!r}: expected NAME:yes or NAME:no items, comma-separated "
                              f"(e.g. flags=norm_before_gate:no), got {item!r}")
        if name in read:
            raise DomainError(f"{where}: {key}={value!r}: {name} given twice")
        read[name] = words[word]
    if not read:
        raise DomainError(f"{where}: {key}={value!r}: expected NAME:yes or NAME:no items, comma-separated")
    return tuple(sorted(read.items()))


def _floor(amax: bool):
    """A scale floor: a name of SCALE_FLOORS or a number (only a number for amax_floor), as its repr."""
    def read(where, key, value):
        try:
            spelt = read_floor(str(value))
        except ValueError:
            spelt = None
        if spelt is None or spelt.startswith("amax:") or (amax and spelt in SCALE_FLOORS):
            raise DomainError(f"{where}: {key}={value!r}: expected " + ("a positive number (e.g. 1e-10)" if amax else
                              f"one of {', '.join(SCALE_FLOORS)} or a positive number (e.g. 1e-10)"))
        return spelt
    return read


def _some(values):
    """Some of ``values``, comma-separated (or a list of them), kept in their order there."""
    def read(where, key, value):
        names = _names(value)
        bad = [n for n in names if n not in map(str, values)]
        if bad or not names:
            raise DomainError(f"{where}: {key}={value!r}: expected some of {', '.join(map(str, values))}, "
                              f"comma-separated")
        return tuple(v for v in values if str(v) in names)
    return read


ARG_VALUES = {"group": GROUPS, "approximate": APPROXIMATE, "layout": SCALE_LAYOUTS, "block_layout": BLOCK_LAYOUTS,
              "block_format": tuple(BLOCK_FORMATS)}


_READ = {"dtypes": _dtypes, "params": _choice("same", "float32"), "residual": _choice("same", "float32"),
         "max_width": _positive, "width_multiple": _positive, "contiguous": _choice("last", "all"), "ranks": _ranks, "weightless": _yes_no,
         "flags": _flags, "unsupported": _option_names, "capturable": _yes_no, **{key: _choice(*values) for key, values in CONTRACT.items()},
         "scale_floor": _floor(amax=False), "amax_floor": _floor(amax=True), "groups": _some(GROUPS),
         "approximate": _some(APPROXIMATE),
         "layouts": _some(SCALE_LAYOUTS + BLOCK_LAYOUTS), "block_formats": _some(tuple(BLOCK_FORMATS)),
         "autocast": _choice("keeps", "casts"), "dy": _choice("kept", "overwritten")}
