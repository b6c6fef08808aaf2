"""Gradients: every input's gradient against the oracle's vector-Jacobian product.

For random upstream gradients dy (drawn in the output dtype; zero at padded
batch_norm positions, whose outputs are not part of the op), each gradient a
kernel's autograd returns for x, residual, weight, bias, gate, up must be
within the error model's backward bound of the exact VJP, and have its
input's shape and dtype.  The backward must leave dy as it was given
(autograd may hand the same tensor to the backward of another use of the
output: writing dx over dy, as "in-place" backwards do, corrupts that
gradient; a kernel declaring ``dy=overwritten`` may, its gradients then held
to the VJP of the dy it was handed), and every input of the forward as it was given (a backward that
writes its gradients over the forward's gate and up, as Liger's SwiGLU does to
save memory, corrupts tensors its caller still holds: the failure names the
input, and the case keeps the values the forward saw).  A kernel whose outputs
carry no grad_fn is not certified by either family (forward only,
``runner.forward_only``); one whose outputs carry a grad_fn on some inputs and
not on others fails.

Each case is called in a drawn context (``search.context``): which inputs require grad (all, or
one leaf alone: the gradients asked for are exactly those, as a frozen weight asks), the default
dtype, the calling thread, the layout of dy (contiguous, a transposed view, a slice of a wider
buffer, a row expanded with stride 0), with the exact VJP taken of the dy handed over, autocast
around the forward (its backward outside, as torch's AMP recipe runs it), torch's thread count and
deterministic algorithms (around the backward too), and the parameters held as plain tensors or
``nn.Parameter`` objects.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from hypothesis import strategies as st

from ... import oracle
from ...oracle import assessment, formats

from ..harness.calling import backward, called, effective, held_to, laid_out, naming
from ..harness.measure import record_assessment
from ..harness.sandbox import ContractViolation, check_unmutated, snapshot
from ..search.buckets import integer
from ..search.context import TRAINING, contexts
from ..search.strategies import cases, cotangents

DRAWN = ("requires", "dtype", "thread", "dy", "autocast", "threads", "held", "deterministic")
"""The context fields the gradients family draws (``search.context``); grad mode is on, buffers fresh."""


@st.composite
def gradient_cases(draw, op, dtype, device, bucket=None):
    case = draw(cases(op, dtype, device, profiles=("normal", "lattice", "offset", "constant"), hostile=False,
                      max_elems=1 << 13, max_n=4096, bucket=bucket))
    case.params["cot_seed"] = draw(integer(0, 2 ** 32 - 1, bucket, "cot_seed"))
    case.context = draw(contexts(case.record.grads_in(case.tensors), TRAINING, DRAWN, bucket, training=True))
    return case


def fresh_leaves(case):
    """The case with fresh leaf tensors (same values and dtype) for the inputs that get gradients."""
    leaves = {k: case.tensors[k].detach().clone().requires_grad_(True) for k in case.record.grads_in(case.tensors)}
    return case.replace(**leaves), leaves


def case_cotangents(case, outs) -> tuple[torch.Tensor, ...]:
    """The upstream gradients of ``outs`` for this case: the case's own (``Case.cotangents``), or, at
    its first check, drawn from its ``cot_seed`` in each output's dtype, zero at padded positions (a
    masked op's), and kept in the case: a failure is then reduced and replayed with the dy it failed
    on (a backward wrong only for some dy, as a float16 product dy * up that overflows, is not lost
    when a smaller case would draw other values)."""
    if case.cotangents is None:
        rng = np.random.default_rng(int(case.params["cot_seed"]))
        cot = cotangents(rng, [(o.shape, o.dtype) for o in outs], case.main.device)
        mask = case.tensors.get(case.record.mask) if case.record.mask else None
        if mask is not None:
            cot = tuple(c * mask.unsqueeze(-1).to(c.dtype) for c in cot)
        case.cotangents = dict(zip(case.record.outputs, cot))
    return tuple(case.cotangents[name].to(o.dtype).contiguous() for name, o in zip(case.record.outputs, outs))


def check_gradients(session, impl, case, worst, within=None, mode=""):
    """The gradients of the leaves ``case.context`` asks for, against the exact VJP of the dy handed
    over (in the context's layout).  ``within`` / ``mode``: the calling mode the forward is called in
    (``modes``; autocast), as ``sandbox.invoke`` takes them; the backward runs outside it.  A case
    whose context asks for no gradient (requires="none": served's, one built by hand) asks for all."""
    asked = case.copy(context=replace(case.context, requires="all")) if case.context.requires == "none" else case
    try:
        with naming(impl, asked, TRAINING):
            _check(session, impl, asked, worst, within, mode)
    finally:
        case.cotangents = asked.cotangents  # the dy drawn is the case's own (``case_cotangents``)


def _check(session, impl, case, worst, within, mode):
    info = case.record
    with torch.enable_grad():
        outs, live, leaves = called(session, impl, case, within=within, mode=mode)
    carrying = [o.grad_fn is not None for o in outs]
    if not any(carrying):
        raise ContractViolation(f"{impl.id}: its outputs carry a grad_fn on some inputs, none on this case")
    subset = effective(impl, case).requires != "all"  # an output need not depend on the one leaf asked for
    if not all(carrying) and not subset:  # (add_rms_norm's residual_out = x + residual, weight alone asked)
        raise ContractViolation(f"{impl.id}: only some outputs carry a grad_fn ({dict(zip(info.outputs, carrying))})")
    layout = effective(impl, case).dy
    cot = tuple(laid_out(c, layout) for c in case_cotangents(case, outs))
    names = list(leaves)
    sent = [formats.bits(c).clone() for c in cot]
    used = [k for k, on in enumerate(carrying) if on]  # an output without a grad_fn adds 0 to every gradient
    inputs = snapshot(live)  # the leaves and the inputs the case passed as they are: a backward writes into neither
    grads = backward(session, impl, case,
                     lambda: torch.autograd.grad([outs[k] for k in used], [leaves[k] for k in names],
                                                 [cot[k] for k in used], allow_unused=True))
    check_unmutated(impl, live, inputs, backward=True)
    for name, c, before in zip(info.outputs, cot, sent):
        if impl.domain.dy != "overwritten" and not torch.equal(formats.bits(c), before):
            raise ContractViolation(f"{impl.id}: its backward wrote into the incoming gradient of {name!r} "
                                    f"(autograd's grad_output, which the gradients of other uses of {name} may share; "
                                    f"declare dy=overwritten where that is the kernel's choice)")
    held = held_to(case, outs)  # an autocast=casts kernel's outputs in bfloat16: the VJP of its inputs cast
    args = held.oracle_args()
    handed = tuple(b.view(c.dtype) for b, c in zip(sent, cot))  # dy's values as handed over (dy=overwritten: not now)
    exact = oracle.vjp(case.op, handed, **args)
    bounds = held.record.grad_bound(args, handed, exact)
    for k, g in zip(names, grads):
        if g is None:
            raise ContractViolation(f"{impl.id} returned no gradient for {k!r}")
        if g.shape != leaves[k].shape or g.dtype != leaves[k].dtype:
            raise ContractViolation(f"{impl.id}: d{k} has shape {tuple(g.shape)} and dtype {g.dtype}, "
                                    f"expected {tuple(leaves[k].shape)} and {leaves[k].dtype}")
        a = assessment.assess(f"d{k}", g, exact[k], bounds[k], g.dtype)
        record_assessment(a, case, worst)
