"""Compiled: the kernel as a compiled model calls it.

Serving engines register their kernels as torch operators (``torch.library``: ``torch.ops.vllm.rms_norm``,
``torch.ops.sgl_kernel...``) and compile the model with ``torch.compile``.  Two things can then be
wrong that an eager call never shows: the operator's registration (its schema, its fake
implementation, which the compiler traces instead of the kernel, its autograd registration), and
the compiled call itself.  For a kernel that is a torch operator (``impls.is_custom_op``), or any
kernel under ``--compile`` (``Impl.compiles``), on each case:

    opcheck   the kernel is called once eagerly, and every operator outside torch's own (``aten``,
              ``prims``) the call dispatches to is recorded with its arguments; each is then checked
              by ``torch.library.opcheck`` on those arguments (schema and mutation, the fake
              implementation's shapes, dtypes and strides against the real one's, the autograd
              registration, AOT dispatch): its failure fails the case with opcheck's own message;
    compiled  the kernel called as ``torch.compile(kernel, fullgraph=True, dynamic=True)`` (a graph
              break is a failure: a compiled model would split there), its outputs held to
              the oracle under accuracy's bound.

The compiled kernel is made once per kernel and session (``Session.compiled``): its recompilations
(a dtype, a rank, grad mode) are its own, under ``sandbox.RECOMPILE_LIMIT``.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ... import oracle
from ..declared import conventions
from ..search.case import valid_positions
from ..harness.measure import PropertyFailure, check_against_oracle
from ..harness.sandbox import ContractViolation, NotSupported, invoke, kernel_code
from .accuracy import accuracy_cases

MODES = "modes: eager with torch.library.opcheck of the operators it calls, torch.compile(fullgraph=True, dynamic=True)"
"""The result's words for how the kernel was called (``runner.record``)."""

TORCH_NAMESPACES = ("aten", "prim", "prims", "_c10d_functional", "profiler")
"""Operators torch itself defines: the ones ``opcheck`` is not for."""


def compiled_cases(op, dtype, device, bucket=None):
    """accuracy's cases: ordinary, lattice, offset and constant rows in every layout."""
    return accuracy_cases(op, dtype, device, bucket=bucket)


class _Recorder(TorchDispatchMode):
    """Records each call of an operator outside ``TORCH_NAMESPACES``, with copies of its arguments
    taken before it runs (an operator that mutates an input gets the values it was given)."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace not in TORCH_NAMESPACES and func.name() not in self.calls:
            self.calls[func.name()] = (func, tree_map(_copy, args), tree_map(_copy, kwargs))
        return func(*args, **kwargs)


def _copy(a):
    if not isinstance(a, torch.Tensor):
        return a
    c = a.detach().clone()
    return c.requires_grad_(a.requires_grad) if a.requires_grad and c.is_floating_point() else c


def check_compiled(session, impl, case, worst):
    recorder = _Recorder()
    invoke(session, impl, case, within=lambda: recorder, mode="eager, operators recorded")
    for name, (func, args, kwargs) in recorder.calls.items():
        with _named(f"torch.library.opcheck of {name}"):
            kernel_code(session, impl, "", lambda: torch.library.opcheck(func, args, kwargs),  # noqa: B023 - called at once
                        case.dtype)
    with _named("called under torch.compile(fullgraph=True)"):
        outs = invoke(session, compiled(session, impl), case, mode="torch.compile")
        check_against_oracle(outs, case, worst, where=valid_positions(case))


@contextlib.contextmanager
def _named(how: str):
    """A failure inside, said with ``how`` in front; a refusal there is a failure (the eager call
    before it accepted the case)."""
    try:
        yield
    except (PropertyFailure, ContractViolation) as e:
        raise type(e)(f"{how}: {e}") from None
    except NotSupported as e:
        raise ContractViolation(f"{how}: refused a case its eager call accepted: {e.why}") from None


def compiled(session, impl):
    """``impl`` with its kernel compiled (``torch.compile(fullgraph=True, dynamic=True)``) under its
    calling convention's adapter, made once per session."""
    if impl.id not in session.compiled:
        if impl.kernel is None:  # a record built without ``impls.make``: its fn is the contract's
            fn = torch.compile(impl.fn, fullgraph=True, dynamic=True)
        else:
            fn = conventions.adapt(impl.convention, oracle.OPS[impl.op],
                                   torch.compile(impl.kernel, fullgraph=True, dynamic=True))
        session.compiled[impl.id] = dataclasses.replace(impl, fn=fn)
    return session.compiled[impl.id]
