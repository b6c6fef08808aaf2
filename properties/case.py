"""A ``Case``: one concrete input of an op, exactly as the kernel receives it.

The tensors keep their dtype, shape and strides; the scalars are Python floats.
What the op is (its signature, oracle, bounds, call) is its record, ``oracle.OPS``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from normcert.oracle import OPS, Op


@dataclass
class Case:
    op: str
    tensors: dict[str, torch.Tensor]
    scalars: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)  # how the inputs were made (profile, layout)
    params: dict[str, float] = field(default_factory=dict)  # a property's own draws (scale, cotangent seed)

    @property
    def record(self) -> Op:
        return OPS[self.op]

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[OPS[self.op].main].dtype

    @property
    def main(self) -> torch.Tensor:
        return self.tensors[OPS[self.op].main]

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
