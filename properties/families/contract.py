"""The calling contract.

* every call (here and in every other property): outputs of the promised
  count, shape, dtype and device; inputs unchanged afterwards, bit for bit;
  NotImplementedError is "not supported", any other exception a failure;
* layouts: a transposed, sliced or offset input gives the same answer (within
  2 x bound) as its contiguous copy; empty inputs give empty outputs;
* a kernel must support at least one dtype (``test_contract.test_supports_some_dtype``).
"""
from __future__ import annotations

from ... import oracle

from ..search.case import valid_positions
from ..harness.measure import check_pair
from ..harness.sandbox import invoke
from ..search.strategies import cases


def check_contract(session, impl, case, worst):
    outs = invoke(session, impl, case)
    strided = {k: t for k, t in case.tensors.items() if t is not None and not t.is_contiguous()}
    if not strided or case.main.numel() == 0:
        return
    plain = case.replace(**{k: t.contiguous() for k, t in strided.items()})
    ref = invoke(session, impl, plain)
    args = case.oracle_args()
    exact = oracle.forward(case.op, **args)
    bounds = case.record.forward_bound(args, exact)
    for name, o, r, b in zip(case.record.outputs, outs, ref, bounds):
        check_pair(f"{name} (strided vs contiguous)", name, o, r, 2 * b, case, worst, where=valid_positions(case))


def contract_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=("normal", "lattice"), hostile=False, bucket=bucket)
