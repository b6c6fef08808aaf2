"""Residual fusion: a fused op F (record field ``unfused`` = G, e.g. add_rms_norm and rms_norm)
is G(x + r, ...), and hands back x + r.

For every F under test, with its G partner (the plugged G, else the
registry's G of the same name, else eager; one that declares it leaves out the sum's dtype
is passed over):

    residual_out == RNE_dtype(x + r)                       bit for bit (dtype: the residual stream's)
    |y_fused - G(residual_out)| <= bound_F(x, r) + bound_G(s) + |exact_F - exact_G(s)|   (each of G's outputs)

Where the residual stream is float32 and x is not, G runs on the float32 residual_out (its
weight widened to float32, exactly), as the next layer of such a model does.

The second line is claimed on rows where rounding x + r to the dtype did not
overflow: there residual_out holds an inf that x + r does not, so the unfused
rms_norm is NaN while the fused y (of the exact sum) is finite, as the oracle
says it must be (the accuracy property checks that y).  It makes no claim either
wherever bound_F or bound_G makes none (-inf: a block whose exact v holds a NaN
under ``nan=unspecified``, a row past the compute format): there the sum is not a
tolerance (|exact_F - exact_G| is NaN on a NaN block).
"""
from __future__ import annotations

import numpy as np
import torch

from ... import oracle
from ...oracle import assessment, bounds_derived
from ...oracle.formats import DTYPE_NAMES

from ..search.case import Case
from ..harness.measure import check_pair, record_assessment
from ..harness.sandbox import invoke
from ..search.strategies import cases


def partner(session, impl, dtype=None):
    """The unfused kernel this fused kernel is compared with: the plugged one, else the registry's
    of the same name, else eager; one whose declared domain leaves out ``dtype`` (the float32 sum
    of a float32 residual stream beside a bfloat16 x) is passed over for the next."""
    op = oracle.OPS[impl.op].unfused
    pool = [i for i in session.impls if i.op == op]
    if dtype is not None:
        pool = [i for i in pool if i.domain.admits_dtype(DTYPE_NAMES[dtype])]
    for pick in (lambda i: i.backend == "plugin", lambda i: i.name == impl.name, lambda i: i.name == "eager"):
        found = [i for i in pool if pick(i)]
        if found:
            return found[0]
    return session.eager[op]


def check_fusion(session, impl, case, worst):
    rec = case.record
    *ys, res = invoke(session, impl, case)  # G's outputs, then residual_out (``ops._fused``)
    args = case.oracle_args()
    *exact_ys, exact_res = oracle.forward(case.op, **args)
    a = assessment.assess("residual_out", res, exact_res, np.zeros_like(exact_res),
                          rec.out_dtype("residual_out", case.tensors))
    record_assessment(a, case, worst)
    g = oracle.OPS[rec.unfused]
    unfused = Case(g.name, {k: res.detach().clone() if k == g.main else _widened(case.tensors[k], res.dtype)
                            for k in g.tensors}, {k: case.scalars[k] for k in g.scalars}, dict(case.notes))
    other = partner(session, impl, res.dtype)
    ys_u = invoke(session, other, unfused)
    g_args = unfused.oracle_args()
    exact_u = oracle.forward(g.name, **g_args)
    bounds, bounds_u = rec.forward_bound(args, (*exact_ys, exact_res)), g.forward_bound(g_args, exact_u)
    for k, name in enumerate(g.outputs):
        tol = _tolerance(bounds[k], bounds_u[k], exact_ys[k], exact_u[k])
        check_pair(f"{name} vs {other.id}(residual_out)", name, ys[k], ys_u[k], tol, case, worst,
                   where=~bounds_derived.sum_overflows(args["x"], args["residual"]))


def _tolerance(bound, bound_u, exact, exact_u):
    """How far apart the fused and unfused outputs may be: bound_F + bound_G + |exact_F - exact_G|,
    and -inf ("no claim", ``assessment.assess``) wherever either bound makes none: a block outside
    one side's contract (its exact v holds a NaN under ``nan=unspecified``, its row overflows) is
    outside the comparison, though |exact_F - exact_G| is NaN there and a NaN tolerance is a claim."""
    with np.errstate(all="ignore"):
        tol = bound + bound_u + np.abs(exact - exact_u)
    return np.where((bound == -np.inf) | (bound_u == -np.inf), -np.inf, tol)


def _widened(t, dtype):
    """A weight for G's rows of ``dtype``: as it is, or widened (exactly) to ``dtype`` where G would
    not take it (a bfloat16 weight beside a float32 residual stream)."""
    return t if t is None or t.dtype in (dtype, torch.float32) else t.to(dtype)


def fusion_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=("normal", "lattice", "offset"), hostile=True, bucket=bucket)
