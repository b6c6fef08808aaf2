"""Bitwise reproducibility (gating only with --bitwise; otherwise reported as warnings).

* determinism        the same input twice gives the same bits
* batch invariance   a row computed alone gives the same bits as inside its batch
                     (row-wise ops)

Neither is numerical correctness -- a kernel with atomics or batch-size-
dependent tiling can be accurate and still fail them -- but both matter for
reproducible inference, so they are checked and reported every run.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from normcert.oracle.formats import bits

from .families import BY_NAME
from .harness import ContractViolation, PropertyFailure, certify, invoke
from .strategies import cases


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(bits(a), bits(b))


def check_determinism(session, impl, case, worst):
    """Two calls, the first call's outputs copied before the second (a kernel that hands back one
    reused buffer would otherwise compare its second answer with itself)."""
    first = invoke(session, impl, case)
    kept = [o.clone() for o in first]
    second = invoke(session, impl, case)
    for name, a, b in zip(case.record.outputs, first, second):
        if a.numel() and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
            raise ContractViolation(f"{impl.id} returned {name} in the same buffer on two calls "
                                    f"(the first caller's result was overwritten)")
    for name, a, b in zip(case.record.outputs, kept, second):
        if not _same_bits(a, b):
            raise PropertyFailure(f"{name}: two calls on the same input differ in their bits")


@st.composite
def batch_cases(draw, op, dtype, device, bucket=None):
    case = draw(cases(op, dtype, device, profiles=("normal", "lattice", "offset"), hostile=False, min_rows=2))
    rows = int(np.prod(case.main.shape[:-1]))
    case.params["row"] = draw(st.integers(0, rows - 1))
    return case


def check_batch_invariance(session, impl, case, worst):
    info = case.record
    r = int(case.params["row"])
    batch = invoke(session, impl, case)
    alone = case.replace(**{k: case.tensors[k].reshape(-1, case.tensors[k].shape[-1])[r : r + 1]
                            for k in info.row_inputs})
    single = invoke(session, impl, alone)
    for name, a, b in zip(info.outputs, batch, single):
        if not _same_bits(a.reshape(-1, a.shape[-1])[r : r + 1], b):
            raise PropertyFailure(f"{name}: row {r} computed alone differs in its bits from the same row in the batch")


def determinism_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=("normal", "lattice"), hostile=False, bucket=bucket)


def test_determinism(normcert_session, impl, dtype):
    certify(normcert_session, BY_NAME["determinism"], impl, dtype)


def test_batch_invariance(normcert_session, impl, dtype):
    certify(normcert_session, BY_NAME["batch-invariance"], impl, dtype)
