"""Agreement: two kernels of one op give the same bits (``--agree OP=A OP=B``).

A training kernel and the inference kernel serving the same model, or a kernel and the
reference a batch-invariant mode must match, must return identical outputs:

    bits(A(case)) == bits(B(case))      for every output, on every case

over the accuracy family's search and buckets (each kernel is certified against the oracle
besides).  Bits are compared as stored, so -0 and +0 differ; a NaN agrees with any NaN (its
payload is not arithmetic).  The kernel it is checked against (``Impl.agrees_with``, the first
``--agree`` kernel of the op) runs its first autotuned config; the kernel under test runs each
of its own (``runner``).
"""
from __future__ import annotations

import numpy as np
import torch

from ...oracle.assessment import worst_elements
from ...oracle.formats import DTYPE_NAMES, OUTPUT_FORMATS, bits, to_float64

from ..harness.measure import PropertyFailure
from ..harness.sandbox import invoke


def _apart(t: torch.Tensor, i: tuple) -> str:
    """Element i of t, its value and its stored bits in hex."""
    v = t[i]
    width = max(1, torch.finfo(t.dtype).bits // 4)
    raw = int(bits(v.reshape(1))[0]) & ((1 << (4 * width)) - 1)
    return f"{float(v):.9g} (0x{raw:0{width}x})"


def disagreement(name: str, a: torch.Tensor, b: torch.Tensor, differ: np.ndarray, at: tuple) -> dict | None:
    """The per-element data of output ``name`` where ``a`` (the kernel under test) and ``b`` (the
    kernel it must agree with) differ (``differ``, first at ``at``), for the report's card: how many
    steps of the output's format apart each element is (``Format.rank``: 0 for -0 against +0, inf
    where one is finite and the other not), the most apart first.  None for an output in no format."""
    form = OUTPUT_FORMATS.get(a.dtype)
    if form is None:
        return None
    x, y = to_float64(a), to_float64(b)
    with np.errstate(all="ignore"):
        steps = np.where(np.isfinite(x) & np.isfinite(y), np.abs(form.rank(x) - form.rank(y)), np.where(differ, np.inf, 0.0))
    return worst_elements("agreement", name, form.name, at, x, y, 0.0, np.where(differ, np.inf, 0.0), steps, differ,
                          differ.size, rank=steps)


def check_agreement(session, impl, case, worst):
    other = impl.agrees_with
    mine, theirs = invoke(session, impl, case), invoke(session, other, case)
    for name, a, b in zip(case.record.outputs, mine, theirs):
        if a.dtype != b.dtype or a.shape != b.shape:
            raise PropertyFailure(f"{name}: {impl.id} gives {DTYPE_NAMES.get(a.dtype, a.dtype)}{tuple(a.shape)} and "
                                  f"{other.id} gives {DTYPE_NAMES.get(b.dtype, b.dtype)}{tuple(b.shape)}")
        a, b = a.detach().cpu(), b.detach().cpu()
        differ = (bits(a) != bits(b)) & ~(torch.isnan(a.float()) & torch.isnan(b.float()))
        if differ.any():
            i = tuple(int(k) for k in np.argwhere(differ.numpy())[0])
            case.elements = disagreement(name, a, b, differ.numpy(), i)
            raise PropertyFailure(f"{name}[{', '.join(map(str, i))}]: {impl.id} gives {_apart(a, i)} and {other.id} "
                                  f"gives {_apart(b, i)}; {int(differ.sum())} of {differ.numel()} elements differ "
                                  f"in their bits")
