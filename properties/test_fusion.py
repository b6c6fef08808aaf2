"""Residual fusion: add_rms_norm(x, r) is rms_norm(x + r), and hands back x + r.

For every add_rms_norm under test, with its rms_norm partner (the plugged
rms_norm, else the registry's rms_norm of the same name, else eager):

    residual_out == RNE_dtype(x + r)                       bit for bit
    |y_fused - rms_norm(residual_out)| <= bound_add(x, r) + bound_rms(s) + |exact_add - exact_rms(s)|

The second line is claimed on rows where rounding x + r to the dtype did not
overflow: there residual_out holds an inf that x + r does not, so the unfused
rms_norm is NaN while the fused y (of the exact sum) is finite, as the oracle
says it must be (the accuracy property checks that y).
"""
from __future__ import annotations

import numpy as np

from normcert import oracle
from normcert.oracle import error_model
from normcert.oracle.formats import to_float64

from .harness import CONFIG, certify, invoke, record_assessment
from .opinfo import Case
from .strategies import cases


APPLIES = {"test_fusion": lambda impl: impl.op == "add_rms_norm"}


def partner(impl):
    """The rms_norm this fused kernel is compared with."""
    pool = [i for i in CONFIG["impls"] if i.op == "rms_norm"]
    for pick in (lambda i: i.backend == "plugin", lambda i: i.name == impl.name, lambda i: i.name == "eager"):
        found = [i for i in pool if pick(i)]
        if found:
            return found[0]
    return CONFIG["eager"]["rms_norm"]


def check_fusion(impl, case, worst):
    y, res = invoke(impl, case)
    args = case.oracle_args()
    exact_y, exact_res = oracle.forward("add_rms_norm", **args)
    a = error_model.assess("residual_out", res, exact_res, np.zeros_like(exact_res), case.dtype)
    record_assessment(a, case, worst)
    unfused = Case("rms_norm", {"x": res.detach().clone(), "weight": case.tensors["weight"]},
                   {"eps": case.scalars["eps"]}, dict(case.notes))
    other = partner(impl)
    (y_u,) = invoke(other, unfused)
    rms_args = unfused.oracle_args()
    exact_u = oracle.forward("rms_norm", **rms_args)
    with np.errstate(all="ignore"):
        tol = (error_model.forward_bounds("add_rms_norm", args, (exact_y, exact_res))[0]
               + error_model.forward_bounds("rms_norm", rms_args, exact_u)[0]
               + np.abs(exact_y - exact_u[0]))
    a = error_model.assess(f"y vs {other.id}(residual_out)", y, to_float64(y_u), tol, case.dtype,
                           where=~error_model.residual_overflows(args))
    record_assessment(a, case, worst)


def test_fusion(impl, dtype):
    strategy = cases("add_rms_norm", dtype, CONFIG["device"], profiles=("normal", "lattice", "offset"), hostile=True)
    certify("fusion", impl, dtype, strategy, check_fusion)
