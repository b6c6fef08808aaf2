"""The op record: everything the suite knows about one op, in one place.

Modelled on PyTorch's OpInfo.  An ``Op`` owns its signature (named arguments,
each of a *kind*), its oracle (forward and VJP, the maths in its module's
docstring), its error-model bounds (derived in ``error_model`` and the ``bounds_*``
modules; the record names which apply), how a kernel is called, and its flags.  Every
consumer (validation, strategies, probe, gradcheck, replay, benchmarks, the
properties) loops over records and reads these fields; none of them names an op.

Argument kinds (``kinds.KINDS``: rows, stream, weight, bias, matrix, vector, mask, eps, alpha,
approximate, scale, flag, qdtype, scale_ub, group, group_size, scale_format, layout, counts, block_format,
global_scale, block_layout, and the contract kinds nan, scale_floor, tail) are records too: how an argument is checked, sampled, drawn and given to the
oracle is its kind's, in ``kinds`` alone.  An ``optional`` argument may be passed as None (a
weightless call, as vLLM, quack and Llama-4's QK-norm make it): it then means its kind's identity,
a weight of ones or a bias of zeros, and gets no gradient.

An ``option`` is an argument an op gained after kernels were written to its contract (the gated
norm's ``group_size``): the op's ``call`` never names it; the record passes it by keyword on top,
``fn(..., name=value)``, and only where a case gives it (value not None, its kind's "absent", so a
kind that may be None).  A case without it calls a kernel exactly as the op's first contract did,
and a kernel whose signature has no such parameter is certified on those cases alone
(``properties.declared.signature``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from . import validate as v
from .dynamic_quant import QDTYPES
from .formats import E2M1, UE8M0, fmt
from .fp4 import BLOCK_FORMATS, MAX_BLOCK, decode_scales, padded, rounding, unpack_e2m1
from .kinds import GROUPS, KINDS

# the kinds of argument an output trait may name, and what the trait reads of each
TRAIT_KINDS = {"dtype_arg": ("qdtype", "block_format"), "group_arg": ("group", "block_format"),
               "format_arg": ("scale_format", "block_format"), "layout_arg": ("layout", "block_layout")}
LARGEST_GROUP = {"group": max(GROUPS), "block_format": MAX_BLOCK}  # a per-group op's rows are multiples of it


def group_of(kind: str, value) -> int:
    """The group size an argument of ``kind`` ("group" or "block_format") gives its output."""
    return int(value) if kind == "group" else BLOCK_FORMATS[value].block


def stored_format(kind: str, value):
    """The format a scale is stored in by an argument of ``kind``: UE8M0 for "ue8m0", a block
    format's scale format, None for "float32" (its dtype's)."""
    if kind == "block_format":
        return BLOCK_FORMATS[value].scale
    return UE8M0 if value == "ue8m0" else None


@dataclass(frozen=True)
class Arg:
    name: str
    kind: str  # a name in ``kinds.KINDS``
    optional: bool = False  # may be None: the kind's identity (a kind that has one)
    option: bool = False  # gained after the op's first contract: by keyword, only where not None (module docstring)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Arg {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.optional and KINDS[self.kind].identity is None:
            raise ValueError(f"Arg {self.name}: a {self.kind} has no identity, so it cannot be optional")
        if self.option and not KINDS[self.kind].may_be_none:
            raise ValueError(f"Arg {self.name}: a {self.kind} cannot be None (absent), so it cannot be an option")


@dataclass(frozen=True)
class Out:
    """One output of an op and its traits.

    dtype:      its dtype whatever the main dtype (None: ``like``'s dtype)
    like:       the input whose dtype it has when ``dtype`` is None (None: the main tensor), as
                residual_out has the residual stream's
    rounded:    defined as the exact value rounded (nearest even) to its dtype: checked bit for bit
    quantised:  an output of a narrow ``dtype`` (float8_e4m3fn, int8): the exact value v rounded once
                to it (nearest even, saturating: ``formats``).  The oracle gives v; the forward bound
                B is on the kernel's value *before* that last rounding, and a kernel's output must
                lie in [RNE(v - B), RNE(v + B)]: one of the two neighbours of v where B reaches past
                a midpoint, bit-exact elsewhere (``assessment.assess``)
    dtype_arg:  the argument (of kind "qdtype", or "block_format": its scale's dtype) whose value names
                the output's dtype, where the caller chooses it (None: ``dtype`` or ``like`` decides)
    shape:      "rows", the op's output shape (``Op.out_shape``), "leading": one value per row,
                x.shape[:-1] (a per-row scale), or "groups": one value per group of ``group_arg``
                consecutive elements of a row, x.shape[:-1] + (n / group,) (a per-group scale)
    group_arg:  the argument (of kind "group", or "block_format": its block) whose value gives the
                group size of a "groups" output
    format_arg: the argument (of kind "scale_format" or "block_format") whose value names the number
                format the output is stored in: "float32" (checked against its bound), "ue8m0" (a
                power of two, rounded up: quantised to ``formats.UE8M0``, checked to the step), or a
                block format's scale format (E4M3 or UE8M0, ``fp4``), checked to the step
    layout_arg: the argument (of kind "layout" or "block_layout") whose value says how the output is
                laid out in memory: "row_major" (contiguous) or "column_major" (groups first), "linear"
                (contiguous) or "swizzled" (a contiguous padded (R', G') tensor in the tensor cores'
                128 x 4 tiles, ``fp4``); the calling contract checks its strides
                (``properties.harness.sandbox``), and a swizzled one is read back through its index map
                (``Op.decode``)
    packed:     stored two E2M1 values to a uint8 byte (element 2j in byte j's low nibble, ``fp4``):
                the kernel returns uint8 of shape (..., n / 2), checked as the E2M1 values it holds
                (``Op.decode``), quantised to ``formats.E2M1``
    scale:      the output holding the scale, one per row, that this quantised output was divided by
                before its rounding, computed by the kernel (``dynamic_quant``).  The oracle's value is
                v / S for the exact scale S, and its bound allows any scale within the scale's bound
                (so two calls compare); the accuracy check divides v by the kernel's own scale instead
                (``Op.forward_bound(..., kernel_scale=)``, ``bounds_quant``): y to the step against
                the scale it was divided by
    """

    name: str
    dtype: torch.dtype | None = None
    like: str | None = None
    rounded: bool = False
    quantised: bool = False
    dtype_arg: str | None = None
    shape: str = "rows"
    scale: str | None = None
    group_arg: str | None = None
    format_arg: str | None = None
    layout_arg: str | None = None
    packed: bool = False

    def __post_init__(self):
        if self.quantised and self.dtype is None and self.dtype_arg is None:
            raise ValueError(f"Out {self.name}: a quantised output names the dtype it is quantised to")
        if self.dtype_arg is not None and (self.dtype is not None or self.like is not None):
            raise ValueError(f"Out {self.name}: its dtype is its argument {self.dtype_arg}'s, not dtype or like")
        if self.shape not in ("rows", "leading", "groups"):
            raise ValueError(f"Out {self.name}: shape must be rows, leading or groups, got {self.shape!r}")
        if (self.shape == "groups") != (self.group_arg is not None):
            raise ValueError(f"Out {self.name}: a groups output names its group argument, and only it")
        if self.scale is not None and not self.quantised:
            raise ValueError(f"Out {self.name}: only a quantised output is divided by a scale")
        if self.quantised and self.rounded:
            raise ValueError(f"Out {self.name}: quantised (to the step) or rounded (bit for bit), not both")
        if self.like is not None and self.dtype is not None:
            raise ValueError(f"Out {self.name}: a dtype of its own or its input {self.like}'s, not both")
        if self.packed and (self.dtype != torch.uint8 or not self.quantised or self.shape != "rows"):
            raise ValueError(f"Out {self.name}: a packed output is quantised, of dtype uint8 and of shape rows")


def ieee(bound: Callable) -> Callable:
    """``bound`` computed under ``np.errstate(all="ignore")``.  A bound is IEEE float64 arithmetic in
    which inf and NaN are values with a meaning: an input row holding inf, a sum that overflows, 0 inf
    on a row that carries no claim; every bound decides such rows by its claim and isfinite guards,
    never by a floating-point warning.  Unsilenced, numpy's warnings would be normcert's own noise in
    every run, and under ``PYTHONWARNINGS=error`` an exception in the checking code."""
    if getattr(bound, "ieee", False):  # a record made again (``dataclasses.replace``): wrapped once
        return bound

    @functools.wraps(bound)
    def quiet(*args, **kwargs):
        with np.errstate(all="ignore"):
            return bound(*args, **kwargs)

    quiet.ieee = True
    return quiet


def with_options(call: Callable, options: tuple[str, ...]) -> Callable:
    """``call`` with each of ``options`` the case gives (not None) passed by keyword on top:
    ``call(partial(kernel, name=value, ...), args)``; ``call`` itself where the op has none."""
    if not options or getattr(call, "options", None) == options:  # a record made again: wrapped once
        return call

    @functools.wraps(call)
    def calling(kernel, args):
        given = {name: args[name] for name in options if args.get(name) is not None}
        return call(functools.partial(kernel, **given) if given else kernel, args)

    calling.options = options
    return calling


@dataclass(frozen=True)
class Op:
    """One op.

    args:        the oracle's arguments in call order, tensors then scalars
    outs:        the outputs (``Out``: name and traits), in the order the kernel returns them
    grads:       the arguments that get a gradient (none: an inference-only op, no backward)
    forward:     oracle forward, ``forward(B, **args) -> outputs`` on backend B
    vjp:         oracle VJP, ``vjp(B, cotangents, **args) -> {arg: gradient}`` (None without grads)
    forward_bound: the error model's forward bound, ``forward_bound(args, exact, kernel=True)``;
                 ``kernel=False`` gives the oracle's own error alone
    grad_bound:  the error model's gradient bound, ``grad_bound(args, cotangents, exact)`` (None without grads);
                 both run under ``ieee`` (no floating-point warnings: inf and NaN are values of theirs)
    call:        ``call(kernel, args) -> outputs``: how a kernel is called, args by name; it names no
                 option (``Arg.option``): the record passes those by keyword on top (``with_options``)
    rowwise:     output row r depends on input row r only
    scale_invariant: y(c x, c^2 eps) = y(x, eps);  shift_invariant: y(x + d) = y(x)
    halves:      the main tensor's last dim is [gate | up]: even, outputs n/2 wide
    max_width, max_rank: the largest cases drawn (the oracle's cost, e.g. an n x n sublayer per row)
    unfused:     the op this one fuses with the residual add: ``self(x, residual, ...)`` is
                 ``(unfused(x + residual, ...), residual_out = x + residual)``
    headwise:    models also apply it per attention head (QK-norm): over the last dim of a
                 (tokens, heads, head_dim) view of a fused QKV projection, one weight of length head_dim
    indeterminate: where an infinite exact output may come back NaN (``bounds_gated``), or None
    width_multiple: every output row drawn is a multiple of this long (the main tensor's x-width,
                 half of it for a halves op; a per-group op's groups, an FP4 op's blocks, divide it);
                 1: any length
    centred:     it subtracts its group's mean (a row; batch_norm's: a channel over positions), so
                 offset, near-constant groups are where it breaks (the mean cancels): the accuracy and
                 gradient families schedule them on every run (``buckets.near_constant_buckets``)
    """

    name: str
    args: tuple[Arg, ...]
    outs: tuple[Out, ...]
    grads: tuple[str, ...]
    forward: Callable
    vjp: Callable | None
    forward_bound: Callable
    grad_bound: Callable | None
    call: Callable[[Callable, dict], object]
    rowwise: bool
    scale_invariant: bool = False
    shift_invariant: bool = False
    halves: bool = False
    max_width: int = 16384
    max_rank: int = 4
    unfused: str | None = None
    headwise: bool = False
    indeterminate: Callable | None = None
    centred: bool = False
    width_multiple: int = 1

    def __post_init__(self):
        object.__setattr__(self, "call", with_options(self.call, self.options))
        for name in ("forward_bound", "grad_bound"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, ieee(getattr(self, name)))
        if bool(self.grads) != (self.vjp is not None) or bool(self.grads) != (self.grad_bound is not None):
            raise ValueError(f"Op {self.name}: vjp and grad_bound are given exactly when grads are")
        tensors = {a.name for a in self.args if KINDS[a.kind].tensor}
        strays = [o.like for o in self.outs if o.like is not None and o.like not in tensors]
        if strays:
            raise ValueError(f"Op {self.name}: an output's dtype follows {strays[0]!r}, which is not a tensor argument")
        if self.quantised and not self.rowwise:
            raise ValueError(f"Op {self.name}: a quantised output's oracle resolves rows one at a time; rowwise only")
        kinds = {a.name: a.kind for a in self.args}
        bad = [o.dtype_arg for o in self.outs if o.dtype_arg is not None
               and kinds.get(o.dtype_arg) not in TRAIT_KINDS["dtype_arg"]]
        if bad:
            raise ValueError(f"Op {self.name}: an output's dtype follows {bad[0]!r}, which is not a qdtype "
                             f"or block_format argument")
        shapes = {o.name: o.shape for o in self.outs}
        scales = [o.scale for o in self.outs if o.scale is not None]
        if len(scales) > 1 or any(shapes.get(s) not in ("leading", "groups") for s in scales):
            raise ValueError(f"Op {self.name}: at most one output is divided by a scale, an output of shape "
                             f"leading or groups")
        for o in self.outs:
            for trait in ("group_arg", "format_arg", "layout_arg"):
                name = getattr(o, trait)
                if name is not None and kinds.get(name) not in TRAIT_KINDS[trait]:
                    raise ValueError(f"Op {self.name}: output {o.name}'s {trait} {name!r} is not a "
                                     f"{' or '.join(TRAIT_KINDS[trait])} argument")
            largest = LARGEST_GROUP.get(kinds.get(o.group_arg), 1)
            if self.width_multiple % largest:
                raise ValueError(f"Op {self.name}: a per-group output needs rows a multiple of every drawn group "
                                 f"size (width_multiple {largest})")

    @property
    def outputs(self) -> tuple[str, ...]:
        """The output names, in the order the kernel returns them."""
        return tuple(o.name for o in self.outs)

    @property
    def rounded(self) -> tuple[str, ...]:
        """The outputs checked bit for bit (``Out.rounded``)."""
        return tuple(o.name for o in self.outs if o.rounded)

    @property
    def quantised(self) -> tuple[str, ...]:
        """The outputs quantised to a narrow dtype of their own (``Out.quantised``)."""
        return tuple(o.name for o in self.outs if o.quantised)

    def quantised_dtype(self, name: str) -> torch.dtype | None:
        """The fixed dtype output ``name`` is quantised to, or None (it is not quantised, or the
        caller chooses its dtype: ``Out.dtype_arg``)."""
        return next((o.dtype for o in self.outs if o.name == name and o.quantised), None)

    def _out(self, name: str) -> Out:
        return next(o for o in self.outs if o.name == name)

    def _kind(self, arg: str) -> str:
        return next(a.kind for a in self.args if a.name == arg)

    def _stored(self, name: str, args: dict | None):
        """The format output ``name`` is stored in in a call on ``args`` where an argument names it
        (``Out.format_arg``: UE8M0, or a block format's E4M3 / UE8M0), else None."""
        o = self._out(name)
        if o.format_arg is None or args is None:
            return None
        if self._kind(o.format_arg) == "block_format":  # its rounding under the declared rules
            return rounding(args, o.format_arg)
        return stored_format(self._kind(o.format_arg), args[o.format_arg])

    def is_quantised(self, name: str, args: dict | None = None) -> bool:
        """Is output ``name`` quantised in a call on ``args``: a quantised output, or one stored in
        a narrow format an argument names (``Out.format_arg``: "ue8m0", a block format's scale)."""
        return name in self.quantised or self._stored(name, args) is not None

    def quantised_format(self, name: str):
        """The fixed format a quantised output is rounded to (E2M1 for a packed one), or None."""
        o = self._out(name)
        if not o.quantised or (o.dtype is None and not o.packed):
            return None
        return E2M1 if o.packed else fmt(o.dtype)

    def out_format(self, name: str, args: dict):
        """The number format output ``name`` of a call on ``args`` is checked in (as ``decode``
        gives it): E2M1 for a packed output, the format its ``format_arg`` names, else its dtype's."""
        if self._out(name).packed:
            return E2M1
        return self._stored(name, args) or fmt(self.out_dtype(name, args))

    @property
    def scaled(self) -> dict[str, str]:
        """{output: the output holding the scale it was divided by} (``Out.scale``)."""
        return {o.name: o.scale for o in self.outs if o.scale is not None}

    def out_dtype(self, name: str, args: dict) -> torch.dtype:
        """The dtype of output ``name`` of a call on ``args`` (by name; the main tensor, the one the
        output follows, ``Out.like``, and a qdtype it names, ``Out.dtype_arg``, suffice)."""
        o = self._out(name)
        if o.dtype_arg is not None:
            value = args[o.dtype_arg]
            return BLOCK_FORMATS[value].scale_dtype if self._kind(o.dtype_arg) == "block_format" else QDTYPES[value]
        return o.dtype or args[o.like or self.main].dtype

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if KINDS[a.kind].tensor)

    @property
    def scalars(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if not KINDS[a.kind].tensor)

    @property
    def row_inputs(self) -> tuple[str, ...]:
        """The tensors that share the main tensor's rows (perturbed together)."""
        return tuple(a.name for a in self.args if KINDS[a.kind].shape == "rows")

    @property
    def main(self) -> str:
        return self.row_inputs[0]

    @property
    def mask(self) -> str | None:
        """The mask argument's name (None: the op has none)."""
        return next((a.name for a in self.args if a.kind == "mask"), None)

    @property
    def counts(self) -> str | None:
        """The counts argument's name (None: the op has none): x is (experts..., tokens, n) and only
        the first counts[e] rows of expert e are valid (``kinds``)."""
        return next((a.name for a in self.args if a.kind == "counts"), None)

    def valid(self, tensors: dict):
        """Where the op's outputs are claimed, a bool tensor of the main tensor's leading dims: its
        mask, or the rows t < counts[e] of each expert; None where every row is (no mask, no counts,
        or either given as None)."""
        if self.mask is not None:
            return tensors.get(self.mask)
        c = tensors.get(self.counts) if self.counts is not None else None
        if c is None:
            return None
        tokens = tensors[self.main].shape[-2]
        return torch.arange(tokens, device=c.device) < c[..., None]

    @property
    def optional(self) -> tuple[str, ...]:
        """The arguments that may be None (a weightless call)."""
        return tuple(a.name for a in self.args if a.optional)

    @property
    def options(self) -> tuple[str, ...]:
        """The options (``Arg.option``): passed by keyword, and only where a case gives them."""
        return tuple(a.name for a in self.args if a.option)

    def grads_in(self, args: dict) -> tuple[str, ...]:
        """The inputs that get a gradient in this call: ``grads`` less those passed as None."""
        return tuple(k for k in self.grads if args.get(k) is not None)

    def call_outputs(self, fn: Callable, args: dict) -> tuple:
        """``call(fn, args)``'s result as a tuple of outputs (a lone tensor is the one output);
        no contract check: that is ``properties.harness.sandbox``'s."""
        out = self.call(fn, args)
        return out if isinstance(out, tuple) else (out,)

    def out_shape(self, shape: tuple) -> tuple:
        """The shape of the op's row outputs for a main tensor of ``shape`` (half as wide for halves)."""
        return tuple(shape[:-1]) + (shape[-1] // 2,) if self.halves else tuple(shape)

    def group_size(self, o: Out, args: dict) -> int:
        """The group size of a "groups" output in a call on ``args``."""
        return group_of(self._kind(o.group_arg), args[o.group_arg])

    def value_shapes(self, shape: tuple, args: dict | None = None) -> tuple[tuple, ...]:
        """Each output's shape as values (the oracle's, and ``decode``'s), in order: ``out_shape``,
        its leading dims for a per-row output, and those and n / group for a per-group one
        (``args``: the call's, by name, for its group)."""
        rows = self.out_shape(shape)

        def one(o):
            if o.shape == "leading":
                return rows[:-1]
            if o.shape == "groups":  # ceil: a partial last group (tail=partial) has its own value
                return rows[:-1] + (-(-rows[-1] // self.group_size(o, args)),)
            return rows

        return tuple(one(o) for o in self.outs)

    def _swizzled(self, o: Out, args: dict | None) -> bool:
        return o.layout_arg is not None and args is not None and args[o.layout_arg] == "swizzled"

    def out_shapes(self, shape: tuple, args: dict | None = None) -> tuple[tuple, ...]:
        """Each output's shape as the kernel returns it (the calling contract): ``value_shapes``, but
        n / 2 bytes for a packed output and the padded (R', G') tensor for swizzled scales (``fp4``)."""
        out = []
        for o, v in zip(self.outs, self.value_shapes(shape, args)):
            if o.packed:
                v = v[:-1] + (v[-1] // 2,)
            elif self._swizzled(o, args):
                v = padded(int(np.prod(v[:-1])) if len(v) > 1 else 1, v[-1])
            out.append(tuple(v))
        return tuple(out)

    def decode(self, outs, args: dict) -> tuple:
        """A kernel's outputs (its storage, as ``out_shapes`` gives it) as the values they hold: a
        packed output unpacked to its E2M1 values (float32), swizzled scales read back through their
        index map, stored scales as float32; the others as they are."""
        values = []
        for o, t, v in zip(self.outs, outs, self.value_shapes(tuple(args[self.main].shape), args)):
            if o.packed:
                t = unpack_e2m1(t)
            elif o.layout_arg is not None and self._kind(o.layout_arg) == "block_layout":
                t = decode_scales(t, args[o.layout_arg], v[:-1], v[-1])
            values.append(t)
        return tuple(values)

    def check(self, args: dict) -> None:
        """ValueError naming the op and the argument unless ``args`` fit the signature."""
        x = args[self.main]
        v.tensor(self.name, self.main, x)
        if self.halves:
            v.even_last_dim(self.name, x)
        row = x[..., : x.shape[-1] // 2] if self.halves else x  # a halves op's scalars are of its output row
        partial = any(a.kind == "tail" and args.get(a.name) == "partial" for a in self.args)
        for a in self.args:
            t = args.get(a.name)
            if a.name != self.main and not (t is None and (a.optional or KINDS[a.kind].may_be_none)):
                # under tail=partial a group need not divide the row (the kind checks the rest)
                KINDS[a.kind].check(self.name, a.name, t, None if partial and a.kind == "group"
                                    else row if not KINDS[a.kind].tensor else x)

    def sample(self, dtype: torch.dtype, device="cpu", rows: int = 3, width: int = 6, seed: int = 0) -> dict:
        """A small ordinary input, the same for every consumer that needs one (the dtype probe,
        gradcheck, benchmarks): each argument its kind's ``sample`` (``kinds``: standard normal
        rows, weight 1 + N(0, 1/16), no mask, eps = 1e-5, ...), tensors in ``dtype`` on ``device``.
        ``width`` must be even for ``halves`` ops; it is rounded up to the op's ``width_multiple``."""
        step = self.width_multiple * (2 if self.halves else 1)
        width = max(step, -(-width // step) * step) if self.width_multiple > 1 else width  # a group quant's rows
        gen = torch.Generator().manual_seed(seed)
        normal = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
        out = {}
        for a in self.args:
            val = KINDS[a.kind].sample(normal, rows, width)
            if isinstance(val, torch.Tensor):  # an integer tensor (counts) keeps its dtype
                val = (val.to(dtype) if val.is_floating_point() else val).to(device)
            out[a.name] = val
        return out
