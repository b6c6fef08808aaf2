"""Invariance: the kernel agrees with itself under the op's symmetries.

    scale   y(c x, c^2 eps) = y(x, eps)   c = 2^k   (RMSNorm, add+RMSNorm, LayerNorm, BatchNorm)
    shift   y(x + d) = y(x)                         (LayerNorm, BatchNorm)

Both sides are kernel outputs.  The tolerance is the triangle inequality over
the error model: bound(x) + bound(T x) + |exact(T x) - exact(x)| (the last
term is 0 unless T x had to be rounded to the dtype).
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from ... import oracle
from ...oracle.formats import fmt, to_float64

from ..search.case import valid_positions
from ..harness.measure import check_pair
from ..harness.sandbox import invoke
from ..search.buckets import choice
from ..search.strategies import cases, scales, transforms


@st.composite
def invariance_cases(draw, op, dtype, device, bucket=None):
    case = draw(cases(op, dtype, device, profiles=("normal", "lattice", "offset"), hostile=False, bucket=bucket))
    case.params["transform"] = draw(choice(transforms(oracle.OPS[op]), bucket, "transform"))
    case.params["c"] = draw(scales(bucket))
    case.params["d"] = draw(choice([-3.0, -1.0, -0.5, 0.25, 1.0, 2.0], bucket, "shift"))
    return case


def transformed(case):
    """The case after its transform; inputs are rounded to their dtypes if they must be."""
    info = case.record
    out = case.replace()
    if case.params["transform"] == "scale":
        c = case.params["c"]
        for k in info.row_inputs:
            t = case.tensors[k]
            out.tensors[k] = torch.from_numpy(fmt(t.dtype).round(to_float64(t) * c)).to(t.dtype).to(t.device)
        for a in info.args:
            if a.kind == "eps":
                out.scalars[a.name] = case.scalars[a.name] * c * c
    else:
        x = to_float64(case.main)
        finite = np.abs(x[np.isfinite(x)])
        d = case.params["d"] * (finite.max() if finite.size else 1.0)
        out.tensors[info.main] = torch.from_numpy(fmt(case.dtype).round(x + d)).to(case.dtype).to(case.main.device)
    return out


def check_invariance(session, impl, case, worst):
    other = transformed(case)
    y0, y1 = invoke(session, impl, case), invoke(session, impl, other)
    valid = valid_positions(case)
    args0, args1 = case.oracle_args(), other.oracle_args()
    ex0, ex1 = oracle.forward(case.op, **args0), oracle.forward(case.op, **args1)
    bd0, bd1 = case.record.forward_bound(args0, ex0), case.record.forward_bound(args1, ex1)
    for i, name in enumerate(case.record.outputs):
        if name in case.record.rounded:
            continue  # a rounded output (residual_out) moves with the transform; accuracy checks it bit for bit
        e0, e1 = ex0[i], ex1[i]
        with np.errstate(all="ignore"):
            tol = bd0[i] + bd1[i] + np.where(np.isfinite(e0) & np.isfinite(e1), np.abs(e1 - e0), np.inf)
        # claimed where the error model claims both sides: an unclaimed element (e.g. add_rms_norm's
        # x + r overflowing the dtype) may be NaN on one side and a number on the other
        where = np.isfinite(bd0[i]) & np.isfinite(bd1[i])
        if valid is not None:
            where = where & np.broadcast_to(valid, where.shape)
        check_pair(f"{name} under {case.params['transform']}", name, y1[i], y0[i], tol, case, worst, where=where)
