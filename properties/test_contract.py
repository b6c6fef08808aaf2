"""The calling contract.

* every call (here and in every other property): outputs of the promised
  count, shape, dtype and device; inputs unchanged afterwards, bit for bit;
  NotImplementedError is "not supported", any other exception a failure;
* layouts: a transposed, sliced or offset input gives the same answer (within
  2 x bound) as its contiguous copy; empty inputs give empty outputs;
* a kernel must support at least one dtype.
"""
from __future__ import annotations



from normcert import oracle
from normcert.oracle.formats import DTYPES

from .families import BY_NAME
from .measure import check_pair
from .probes import probe
from .runner import certify
from .sandbox import invoke
from .strategies import cases
from .test_accuracy import valid_positions


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


def test_contract(normcert_session, impl, dtype):
    certify(normcert_session, BY_NAME["contract"], impl, dtype)


def test_supports_some_dtype(normcert_session, impl):
    supported = [d for d in DTYPES if probe(normcert_session, impl, d)]
    assert supported, f"{impl.id} raises NotImplementedError for every dtype ({', '.join(map(str, DTYPES))})"



