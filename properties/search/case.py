"""A ``Case``: one concrete input of an op, exactly as the kernel receives it.

The tensors keep their dtype, shape and strides; the scalars are Python floats.
What the op is (its signature, oracle, bounds, call) is its record, ``oracle.OPS``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ...oracle import OPS, Op
from ...oracle.kinds import KINDS
from .context import AS_TESTED, Context

MAX_ELEMENTS = 1 << 26
"""The most elements a case's tensor may span, declared or stored, and still be written to a replay file
(``replay``: 64 Mi elements; the suite's cases are far smaller, ``--profile large``'s are not)."""


@dataclass
class Case:
    op: str
    tensors: dict[str, torch.Tensor]
    scalars: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)  # how the inputs were made (profile, layout)
    params: dict[str, float] = field(default_factory=dict)  # a property's own draws (scale, cotangent seed)
    config: str = ""  # an autotuned kernel's config the case runs under, by content (``properties.harness.autotune``)
    context: Context = AS_TESTED  # how the kernel is called on it (``context``)
    # a backward's upstream gradient of each output (its name -> dy): drawn from ``params["cot_seed"]``
    # at the case's first check (``gradients.case_cotangents``), then part of the case: the reducer
    # cuts it with the rows and columns it cuts, a replay file keeps it (None: not drawn yet)
    cotangents: dict[str, torch.Tensor] | None = None
    # where a check failed on this case: the failing output's per-element data
    # (``assessment.worst_elements``), which ``replay.save_failure`` keeps for the report's card
    elements: dict | None = field(default=None, compare=False, repr=False)

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
        """One line: op, dtype, shapes and strides (a backward's dy too), scalars, how the values were drawn."""
        parts = []
        for k, t in self.tensors.items():
            if t is None:
                continue
            contiguous = "" if t.is_contiguous() else f" strides={tuple(t.stride())}"
            parts.append(f"{k}: {str(t.dtype).replace('torch.', '')}{tuple(t.shape)}{contiguous}")
        parts += [f"dy of {k}: {str(t.dtype).replace('torch.', '')}{tuple(t.shape)}"
                  for k, t in (self.cotangents or {}).items()]
        parts += [f"{k}={v!r}" for k, v in {**self.scalars, **self.params}.items()]
        parts += [f"{k}={v}" for k, v in self.notes.items()]
        parts += [f"config: {self.config}"] if self.config else []
        parts += [f"context: {self.context.describe()}"] if self.context != AS_TESTED else []
        return f"{self.op}(" + ", ".join(parts) + ")"

    @classmethod
    def sample(cls, op: str, dtype: torch.dtype, device="cpu", rows: int = 3, width: int = 6) -> "Case":
        """The op record's small ordinary input (``Op.sample``) as a case."""
        rec = OPS[op]
        args = rec.sample(dtype, device, rows=rows, width=width)
        return cls(op, {k: args[k] for k in rec.tensors}, {k: args[k] for k in rec.scalars})

    def with_identity(self) -> "Case":
        """The case with each optional weight or bias given as None replaced by its identity (ones
        in x.dtype, zeros): the same op, for a kernel that takes no None."""
        x = self.main
        filled = {a.name: torch.full((x.shape[-1],), KINDS[a.kind].identity, dtype=x.dtype, device=x.device)
                  for a in self.record.args if a.optional and self.tensors.get(a.name) is None}
        if not filled:
            return self
        notes = {k: v for k, v in self.notes.items() if k not in filled}
        return self.copy(tensors={**self.tensors, **filled}, notes=notes)

    def replace(self, **tensors) -> "Case":
        return self.copy(tensors={**self.tensors, **tensors})

    def under(self, config: str) -> "Case":
        """The same case, run under the autotuned kernel's config ``config``."""
        return self.copy(config=config)

    def copy(self, **changes) -> "Case":
        """A new case with ``changes`` to its fields, its dicts its own (the tensors themselves shared)."""
        own = {k: dict(getattr(self, k)) for k in ("tensors", "scalars", "notes", "params", "cotangents")
               if k not in changes and getattr(self, k) is not None}
        return replace(self, **own, **changes)


def valid_positions(case):
    """Where a masked op's outputs are claimed: the positions its mask marks valid, or the rows
    within each expert's count (``record.Op.valid``; None: all)."""
    m = case.record.valid(case.tensors)
    return None if m is None else m.cpu().numpy()[..., None]


def extent(t: torch.Tensor) -> int:
    """Elements from t's first element to its last, in storage order (0 for an empty t)."""
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
