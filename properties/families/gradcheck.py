"""``gradcheck``: torch.autograd.gradcheck's test in float64 on small inputs, with
torch's own finite-difference criterion -- a different question (is the
backward the derivative of the forward?) than accuracy, so it keeps its own
tolerance -- but with a fresh forward for every backward (``finite_differences``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ... import oracle

from ..search.case import Case


def gradcheck_case(op, device):
    return Case.sample(op, torch.float64, device, rows=2, width=4)  # a row per output element: keep it small


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


@dataclass
class Mismatch:
    """Where the backward and the finite differences disagree: d outputs[output].flat[out_elem] /
    d leaves[input].flat[in_elem], as the backward gives it and as central differences do."""

    output: int
    out_elem: int
    input: int
    in_elem: int
    backward: float
    finite: float

    def __str__(self) -> str:
        return (f"d output[{self.output}][{self.out_elem}] / d input[{self.input}][{self.in_elem}]: backward gives "
                f"{self.backward!r}, finite differences {self.finite!r}")


GRADCHECK_ATOL, GRADCHECK_RTOL = 1e-5, 1e-3  # torch.autograd.gradcheck's defaults


def finite_differences(fn, leaves: list, h: float = 1e-6) -> Mismatch | None:
    """torch.autograd.gradcheck's test of ``fn`` at ``leaves`` (float64): None, or the worst mismatch.

    The analytical Jacobian J[i, j] = d out_i / d in_j is built one row at a time, each from a
    forward and a backward of its own: gradcheck backpropagates through one graph again and
    again (retain_graph=True), which a torch.compile'd backward that donates its buffers
    refuses, depending on what compiled it first -- a correct kernel would fail or pass by
    test order.  The numerical Jacobian is central differences (f(x + h e_j) - f(x - h e_j)) / 2h,
    and the criterion gradcheck's own, |J - N| <= atol + rtol |N| with its defaults.
    """
    with torch.no_grad():
        base = _outputs(fn(*leaves))
    rows = []
    for k, o in enumerate(base):
        for i in range(o.numel()):
            live = [t.detach().requires_grad_(True) for t in leaves]
            outs = _outputs(fn(*live))
            cot = [torch.zeros_like(x) for x in outs]
            one_hot = torch.zeros(o.numel(), dtype=o.dtype, device=o.device)
            one_hot[i] = 1.0  # on o's device (an index tensor made on the CPU broke every CUDA run)
            cot[k] = one_hot.view(o.shape)
            grads = torch.autograd.grad(outs, live, cot, allow_unused=True)
            rows.append(torch.cat([torch.zeros(t.numel(), dtype=torch.float64, device=t.device) if g is None
                                   else g.reshape(-1) for t, g in zip(live, grads)]))
    analytic = torch.stack(rows) if rows else torch.zeros(0, sum(t.numel() for t in leaves), dtype=torch.float64,
                                                          device=leaves[0].device if leaves else None)
    columns = []
    with torch.no_grad():
        for j, t in enumerate(leaves):
            for e in range(t.numel()):
                shifted = []
                for sign in (1.0, -1.0):
                    moved = t.detach().clone()
                    moved.view(-1)[e] += sign * h
                    args = [moved if m == j else u for m, u in enumerate(leaves)]
                    shifted.append(torch.cat([o.reshape(-1) for o in _outputs(fn(*args))]))
                columns.append((shifted[0] - shifted[1]) / (2 * h))
    numeric = torch.stack(columns, dim=1) if columns else torch.zeros_like(analytic)
    excess = (analytic - numeric).abs() - (GRADCHECK_ATOL + GRADCHECK_RTOL * numeric.abs())
    if excess.numel() == 0 or not (excess > 0).any():
        return None
    i, j = divmod(int(excess.argmax()), excess.shape[1])
    output, out_elem = _locate(i, [o.numel() for o in base])
    leaf, in_elem = _locate(j, [t.numel() for t in leaves])
    return Mismatch(output, out_elem, leaf, in_elem, float(analytic[i, j]), float(numeric[i, j]))


def _locate(flat: int, sizes: list[int]) -> tuple[int, int]:
    """(which tensor, which element) of position ``flat`` in the concatenation of tensors of ``sizes``."""
    for k, n in enumerate(sizes):
        if flat < n:
            return k, flat
        flat -= n
    raise IndexError(flat)


def which_side(case: Case, names: list[str], m: Mismatch) -> str:
    """The mismatch in words, with the oracle's exact derivative and which of the two is off: the
    backward, or the finite differences (a forward that moves in steps coarser than float64 --
    computed in float32, say -- gives noisy differences while its backward may be right)."""
    rec, args = case.record, case.oracle_args()
    shape = rec.out_shape(tuple(case.main.shape))
    cot = [torch.zeros(shape, dtype=torch.float64, device=case.main.device) for _ in rec.outputs]
    cot[m.output].view(-1)[m.out_elem] = 1.0
    exact = float(np.asarray(oracle.vjp(case.op, cot, **args)[names[m.input]]).reshape(-1)[m.in_elem])
    tol = GRADCHECK_ATOL + GRADCHECK_RTOL * abs(exact)
    off = [side for side, value in (("the backward", m.backward), ("the finite differences", m.finite))
           if not abs(value - exact) <= tol]
    text = (f"d {rec.outputs[m.output]}[{m.out_elem}] / d {names[m.input]}[{m.in_elem}]: backward gives "
            f"{m.backward!r}, finite differences {m.finite!r}, exact {exact!r}")
    if off == ["the finite differences"]:
        return (text + ": the finite differences are off and the backward is right -- the forward moves in "
                       "steps coarser than float64 (does it compute float64 in a lower precision?)")
    return text + f": {' and '.join(off) or 'neither'} off by more than gradcheck's tolerance of the exact value"
