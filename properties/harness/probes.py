"""Questions asked of a kernel once, on its op's small sample input (2 rows of 4): does it accept
the dtype, do its outputs carry a grad_fn, does it run under Triton's interpreter, does it take
None for the op's optional weight and bias.  The answers that are asked again are kept on the
session (``interpreted``, ``weightless``).
"""
from __future__ import annotations

import contextlib

import torch

from ... import oracle
from . import interpreter
from ...oracle.formats import DTYPE_NAMES

from ..search.case import Case
from ..search.fitting import fit
from .measure import Worst, check_against_oracle
from .sandbox import ContractViolation, NotSupported, kernel_code


def sample(session, impl, dtype) -> Case:
    """The op record's small sample input, 2 rows of 4, fitted into the kernel's declared domain."""
    return fit(Case.sample(impl.op, dtype, session.device, rows=2, width=4), impl.domain)


def on_sample(session, impl, dtype, *, grads=False, weightless=False):
    """Call the kernel once on the op record's small sample input (2 rows of 4, fitted into its
    declared domain) under
    ``kernel_code``; with ``grads``, in grad mode with the inputs that get gradients requiring
    grad; with ``weightless``, the op's optional weight and bias given as None.  Returns (outcome,
    outputs, launches): outcome "ok", "refused" (NotImplementedError) or "broke" (raised or hung:
    the properties report it); launches: Triton interpreter launches."""
    rec = oracle.OPS[impl.op]
    case = sample(session, impl, dtype)
    args = case.oracle_args()
    if weightless:
        args.update({k: None for k in rec.optional})
    if grads:
        args.update({k: args[k].detach().requires_grad_(True) for k in rec.grads})
    fresh = session.interpreter is None and not interpreter.imported()
    before = interpreter.launches()
    try:
        with torch.enable_grad() if grads else contextlib.nullcontext():
            outputs = kernel_code(session, impl, "", lambda: rec.call_outputs(impl.fn, args),
                                  (dtype, grads, weightless))
        outcome = "ok"
        if not weightless:  # the case as called (a weightless call's oracle is another)
            _first_call(session, impl, case, outputs)
    except NotSupported:
        outputs, outcome = (), "refused"
    except ContractViolation:
        outputs, outcome = (), "broke"
    if fresh and interpreter.imported():  # the kernel imported triton in this call: corrected, then asked again
        session.interpreter = interpreter.install()
        session.first_calls.pop((impl.id, case.dtype), None)
        return on_sample(session, impl, dtype, grads=grads, weightless=weightless)
    return outcome, outputs, interpreter.launches() - before


def _first_call(session, impl, case, outputs) -> None:
    """Keep what was wrong with the kernel's first call of ``case``'s dtype in this process (``first_call``)."""
    key = (impl.id, case.dtype)
    if key in session.first_calls:
        return
    if not all(type(o) is torch.Tensor and o.device == case.main.device for o in outputs):
        return  # the output contract's to judge (a subclass, a tuple where a tensor is due): the properties say it
    try:
        check_against_oracle(tuple(o.detach() for o in outputs), case, Worst())
        session.first_calls[key] = ""
    except AssertionError as e:
        session.first_calls[key] = str(e)
    except Exception:  # noqa: BLE001 - a shape or dtype the contract refuses: the properties say it
        pass


def first_call(session, impl, dtype) -> str:
    """What was wrong with the kernel's first call of ``dtype`` in this process (a sample call's, on the
    op's 2 x 4 sample, checked against the oracle like any case), or "": a kernel that warms up by
    returning zeros is caught where a warm-up call would hide it.  Said once: the run that asks first
    reports it, and later asks get ""."""
    key = (impl.id, dtype)
    wrong = session.first_calls.get(key, "")
    if wrong:
        session.first_calls[key] = ""
    return wrong


def probe(session, impl, dtype) -> bool:
    """Does the kernel accept this dtype at all? (not NotImplementedError on the op's sample)"""
    return on_sample(session, impl, dtype)[0] != "refused"


def inference_convention(session, impl) -> str:
    """Why a kernel is forward only by its calling convention ("" where it is not): @inplace, @out
    and @outkw are inference conventions, so a kernel called so is forward only unless a backward is
    asked for (its copy_ into the buffers may record a partial graph)."""
    if impl.convention and not (impl.backward or session.require_backward):
        return f"@{impl.convention} is an inference calling convention"
    return ""


def has_backward(session, impl, dtype) -> bool:
    """Do the kernel's outputs carry a grad_fn on the op record's sample input, with the
    inputs that get gradients requiring grad?  (A kernel that refuses the sample or
    breaks on it has its say in the properties themselves: True.)"""
    outcome, outputs, _ = on_sample(session, impl, dtype, grads=True)
    return outcome != "ok" or any(getattr(o, "grad_fn", None) is not None for o in outputs)


def runs_interpreted(session, impl, dtype) -> bool:
    """Does the kernel run under Triton's interpreter here (it launched a kernel there on the op's
    sample input)?  Then every program of its grid is a Python loop iteration.  Decided by the
    launch count, not by ``session.interpreter``: a session built by hand has no corrections
    listed, and its Triton kernels are interpreted all the same."""
    key = (impl.id, DTYPE_NAMES[dtype])
    if key not in session.interpreted:
        session.interpreted[key] = on_sample(session, impl, dtype)[2] > 0
    return session.interpreted[key]


def accepts_weightless(session, impl, dtype) -> bool:
    """Does the kernel take None for its op's optional weight and bias (``oracle.record``)?  Asked
    once, on the op's sample: a kernel that raises there (most do: ``weight.float()`` on None) was
    not written for weightless calls, which is no defect, and its cases give the identity (ones,
    zeros) instead of None; its certificate's domain says so.  One that returns is checked on
    weightless calls like any other (a kernel that reads None as zeros fails accuracy)."""
    key = (impl.id, DTYPE_NAMES[dtype])
    if key not in session.weightless:
        session.weightless[key] = on_sample(session, impl, dtype, weightless=True)[0] == "ok"
    return session.weightless[key]
