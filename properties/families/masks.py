"""Padding masks and row independence.

* padding (masked ops)   outputs at valid positions do not move when the padded
  positions change value -- to NaN, to the dtype's max, to other numbers (a mask's padded
  positions, or the rows past each expert's count: ``record.Op.valid``).
* row independence (row-wise ops)   a row's output does not move when every
  *other* row is replaced -- by NaN, ±inf, near-max values or fresh numbers.

Both compare the kernel with itself at the model's tolerance, 2 x bound
(the exact value is the same on both sides).  That the statistics come from
the valid positions only, and that one valid position gives no NaN, is the
accuracy property's job (its cases include such masks).
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from ... import oracle
from ...oracle.formats import fmt, to_float64

from ..search.case import valid_positions
from ..harness.measure import check_pair
from ..harness.sandbox import invoke
from ..search.buckets import choice, integer
from ..search.strategies import REFILLS, cases, layout_tensor


def _fill(values, rows, kind, rng, f):
    if kind == "fresh":
        values[rows] = f.round(rng.standard_normal(values[rows].shape))
    else:
        values[rows] = {"nan": np.nan, "posinf": np.inf, "neginf": -np.inf, "huge": f.max}[kind]
    return values


def _self_check(session, impl, case, other, where, worst, label):
    y0, y1 = invoke(session, impl, case), invoke(session, impl, other)
    args = case.oracle_args()
    exact = oracle.forward(case.op, **args)
    bounds = case.record.forward_bound(args, exact)
    for name, a0, a1, b in zip(case.record.outputs, y0, y1, bounds):
        check_pair(f"{name} ({label})", name, a1, a0, 2 * b, case, worst, where=where)


@st.composite
def padded_cases(draw, op, dtype, device, bucket=None):
    case = draw(cases(op, dtype, device, profiles=("normal", "lattice", "offset"), hostile=False,
                      padded=True, bucket=bucket))
    case.params["fill"] = draw(choice(REFILLS, bucket, "refill"))
    case.params["fill_seed"] = draw(integer(0, 2 ** 16, bucket, "fill_seed"))
    return case


def check_padding(session, impl, case, worst):
    m = case.record.valid(case.tensors)  # a mask, or the rows within each expert's count
    x = to_float64(case.main)
    rng = np.random.default_rng(int(case.params["fill_seed"]))
    x = _fill(x, ~m.cpu().numpy(), case.params["fill"], rng, fmt(case.dtype))
    other = case.replace(**{case.record.main: layout_tensor(x, case.dtype, "contiguous", case.main.device)})
    _self_check(session, impl, case, other, valid_positions(case), worst, f"padding -> {case.params['fill']}")


@st.composite
def row_cases(draw, op, dtype, device, bucket=None):
    case = draw(cases(op, dtype, device, profiles=("normal", "lattice", "offset", "constant"), hostile=False,
                      min_rows=2, bucket=bucket))
    rows = int(np.prod(case.main.shape[:-1]))
    case.params["row"] = draw(integer(0, rows - 1, bucket, "row"))
    case.params["fill"] = draw(choice(REFILLS, bucket, "refill"))
    case.params["fill_seed"] = draw(integer(0, 2 ** 16, bucket, "fill_seed"))
    return case


def check_row_independence(session, impl, case, worst):
    info = case.record
    keep = int(case.params["row"])
    rng = np.random.default_rng(int(case.params["fill_seed"]))
    replaced = {}
    for k in info.row_inputs:
        t = case.tensors[k]
        v = to_float64(t)
        flat = v.reshape(math.prod(v.shape[:-1]), v.shape[-1])  # not -1: ambiguous for rows of 0 elements
        others = np.ones(flat.shape[0], bool)
        others[keep] = False
        flat = _fill(flat, others, case.params["fill"], rng, fmt(t.dtype))
        replaced[k] = layout_tensor(flat.reshape(v.shape), t.dtype, "contiguous", t.device)
    other = case.replace(**replaced)
    where = np.zeros(info.out_shape(tuple(case.main.shape))[:-1], bool).reshape(-1)
    where[keep] = True
    where = where.reshape(info.out_shape(tuple(case.main.shape))[:-1])[..., None]
    valid = valid_positions(case)  # a masked op's padded rows carry no claim, the kept one's included
    if valid is not None:
        where = where & valid
    _self_check(session, impl, case, other, where, worst, f"row {keep} after the other rows -> {case.params['fill']}")
