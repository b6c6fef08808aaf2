"""One record per op: how the suite calls a kernel and what it may check.

Modelled on PyTorch's OpInfo: the properties are generic; everything they need
to know about an op is here.  A ``Case`` is one concrete input: the tensors,
exactly as the kernel receives them (dtype, shape, strides), and the scalars.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from normcert import oracle


@dataclass
class Case:
    op: str
    tensors: dict[str, torch.Tensor]
    scalars: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)  # how the inputs were made (profile, layout)
    params: dict[str, float] = field(default_factory=dict)  # a property's own draws (scale, cotangent seed)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[INFO[self.op].main].dtype

    @property
    def main(self) -> torch.Tensor:
        return self.tensors[INFO[self.op].main]

    def oracle_args(self) -> dict:
        return {**self.tensors, **self.scalars}

    def describe(self) -> str:
        """One line: op, dtype, shapes and strides, scalars, how the values were drawn."""
        parts = []
        for k, t in self.tensors.items():
            if t is None:
                continue
            contiguous = "" if t.is_contiguous() else f" strides={tuple(t.stride())}"
            parts.append(f"{k}: {str(t.dtype).replace('torch.', '')}{tuple(t.shape)}{contiguous}")
        parts += [f"{k}={v!r}" for k, v in {**self.scalars, **self.params}.items()]
        parts += [f"{k}={v}" for k, v in self.notes.items()]
        return f"{self.op}(" + ", ".join(parts) + ")"

    def replace(self, **tensors) -> "Case":
        return Case(self.op, {**self.tensors, **tensors}, dict(self.scalars), dict(self.notes), dict(self.params))


def affine_sublayer(weight: torch.Tensor, bias: torch.Tensor) -> Callable:
    """The deep_norm sublayer the suite supplies: x -> x @ weight.T + bias, returned in x's dtype.

    Computed in float32 (float64 for float64) and rounded once.  Not F.linear in
    bfloat16 directly: on CPU (torch 2.13) that leaks NaN/inf from one row of x
    into the outputs of other rows, which would blame the kernel for the sublayer.
    """

    def sublayer(t: torch.Tensor) -> torch.Tensor:
        c = torch.float64 if t.dtype == torch.float64 else torch.float32
        return F.linear(t.to(c), weight.to(c), bias.to(c)).to(t.dtype)

    return sublayer


@dataclass(frozen=True)
class OpInfo:
    name: str
    main: str  # the tensor whose dtype / device / rows define the case
    call: Callable[[Callable, Case], object]
    rowwise: bool  # output row r depends on input row r only
    scale_invariant: bool = False  # y(c x, c^2 eps) = y(x, eps)
    shift_invariant: bool = False  # y(x + d) = y(x)
    out_shape: Callable[[Case], tuple] = lambda c: tuple(c.main.shape)

    @property
    def outputs(self) -> tuple[str, ...]:
        return oracle.OPS[self.name].outputs

    @property
    def grads(self) -> tuple[str, ...]:
        return oracle.OPS[self.name].grads

    @property
    def row_inputs(self) -> tuple[str, ...]:
        """Tensors that share the main tensor's rows (perturbed together)."""
        return {"add_rms_norm": ("x", "residual"), "swiglu": ("gate", "up")}.get(self.name, (self.main,))


def _t(c, *names):
    return [c.tensors[n] for n in names]


INFO: dict[str, OpInfo] = {
    i.name: i
    for i in [
        OpInfo("rms_norm", "x", lambda fn, c: fn(*_t(c, "x", "weight"), c.scalars["eps"]),
               rowwise=True, scale_invariant=True),
        OpInfo("add_rms_norm", "x", lambda fn, c: fn(*_t(c, "x", "residual", "weight"), c.scalars["eps"]),
               rowwise=True, scale_invariant=True),
        OpInfo("layer_norm", "x", lambda fn, c: fn(*_t(c, "x", "weight", "bias"), c.scalars["eps"]),
               rowwise=True, scale_invariant=True, shift_invariant=True),
        OpInfo("batch_norm", "x",
               lambda fn, c: fn(*_t(c, "x", "weight", "bias"), c.scalars["eps"], mask=c.tensors["mask"]),
               rowwise=False, scale_invariant=True, shift_invariant=True),
        OpInfo("deep_norm", "x",
               lambda fn, c: fn(c.tensors["x"], affine_sublayer(c.tensors["sub_weight"], c.tensors["sub_bias"]),
                                c.scalars["alpha"], *_t(c, "weight", "bias"), c.scalars["eps"]),
               rowwise=True),
        OpInfo("swiglu", "gate", lambda fn, c: fn(*_t(c, "gate", "up")), rowwise=True),
        OpInfo("silu_and_mul", "x", lambda fn, c: fn(c.tensors["x"]), rowwise=True,
               out_shape=lambda c: tuple(c.main.shape[:-1]) + (c.main.shape[-1] // 2,)),
    ]
}
