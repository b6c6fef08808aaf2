"""Bitwise reproducibility (gating only with --bitwise; otherwise reported as warnings).

* determinism        the same input twice gives the same bits
* batch invariance   every row gives the same bits in every batch it is computed in:
                     alone, in batches of 2 and 3, past 256 rows and past 4096 rows
                     (row-wise ops; ``BATCH_SIZES``)

Neither is numerical correctness -- a kernel with atomics or batch-size-
dependent tiling can be accurate and still fail them -- but both matter for
reproducible inference, so they are checked and reported every run.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

from ...oracle.formats import bits

from ..search.fitting import fit
from ..harness.measure import PropertyFailure
from ..harness.probes import runs_interpreted
from ..harness.sandbox import invoke
from ..search.buckets import MANY_ROWS_INTERPRETED, integer
from ..search.strategies import cases


BATCH_SIZES = (1, 2, 3, 300, 4100)
"""The batch sizes each row is recomputed in: alone, tiny batches, and past the row counts at which
kernels switch block size or split (vLLM#48271: ``num_tokens < 256 ? 1024 : 256``; 4096)."""


BATCH_ELEMS = 1 << 21
"""A batch size is left out where its batch would hold more elements (4100 rows up to width 511,
300 rows up to 6990); under Triton's interpreter, where each program is a Python loop iteration,
``BATCH_ELEMS_INTERPRETED`` (300 rows up to width 109) and no batch of more rows than
``MANY_ROWS_INTERPRETED``, the "many" bucket's scaled 1025 (never 4100: a row-per-program kernel's
4100 programs at widths up to 7 were four fifths of an interpreted certify's batch invariance).
The certificate's domain lists the sizes checked, and under the interpreter says so."""


BATCH_ELEMS_INTERPRETED = 1 << 15
INTERPRETED_SCALING = f"none past {MANY_ROWS_INTERPRETED} rows: Triton's interpreter"  # the domain's words


def batch_sizes(width: int, interpreted: bool) -> tuple[int, ...]:
    """The sizes of BATCH_SIZES a case of rows ``width`` long is recomputed in (``BATCH_ELEMS``)."""
    cap, rows = (BATCH_ELEMS_INTERPRETED, MANY_ROWS_INTERPRETED) if interpreted else (BATCH_ELEMS, max(BATCH_SIZES))
    return tuple(s for s in BATCH_SIZES if s == 1 or s * width <= cap and s <= rows)


def claimed(t: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """The bits of t's elements the op's contract claims (``record.Op.valid``): the rows ``valid`` marks
    where t's leading dims are the main tensor's (a masked MoE op's y and scales: the rows t <
    counts[e], the rows past them left as the kernel likes, torch.empty's bits among them), else all
    of t's, flattened."""
    b = bits(t)
    if valid is None or tuple(b.shape[:valid.dim()]) != tuple(valid.shape):
        return b.reshape(-1)
    return b[valid.to(b.device)].reshape(-1)


def check_determinism(session, impl, case, worst):
    """Two calls on the same input give the same bits where the op claims its outputs (``claimed``;
    ``invoke`` hands back copies, and fails a kernel that returns a buffer it reuses)."""
    first = invoke(session, impl, case)
    second = invoke(session, impl, case)
    valid = case.record.valid(case.tensors)
    for name, a, b in zip(case.record.outputs, first, second):
        if not torch.equal(claimed(a, valid), claimed(b, valid)):
            raise PropertyFailure(f"{name}: two calls on the same input differ in their bits")


@st.composite
def batch_cases(draw, op, dtype, device, bucket=None):
    """Random cases of at least 2 rows; with a bucket (odd, strided: 3 rows of two different widths
    past 256 lanes, one of them at most 5125 wide, so that a batch of 300 fits ``BATCH_ELEMS``)
    the scheduled shape, so that every seed checks rows wide enough for a kernel's block size to
    matter across batch sizes, not only the seeds whose random search drew one; its values are
    made ``telling``, so that no seed's spin (eps 0.5 over rows of 1e-2) hides the last bits."""
    case = draw(cases(op, dtype, device, profiles=("normal", "lattice", "offset"), hostile=False, min_rows=2,
                      bucket=bucket))
    if bucket is not None:
        case = telling(case)
    rows = int(np.prod(case.main.shape[:-1]))
    case.params["shift"] = draw(integer(0, rows - 1, bucket, "shift"))
    return case


TELLING_EPS = 1e-6


def telling(case):
    """``case`` with each row tensor scaled (in place, keeping its layout) by a power of two to a
    largest finite |x| in [1, 2), and eps, where the op has one, at most TELLING_EPS.  Then the row
    holding it has mean(x^2) >= 1/n > eps for every bucket width (n <= 16386), and the rows drawn
    with it are of its scale, so the last bits of each row's reduction, where two summation orders
    differ, reach y.  Used on bucket cases only: they
    must show a batch-size dependence on every seed (a spin to eps = 0.5 over rows of 1e-2 hid it),
    while the random search keeps every scale and eps."""
    for k in case.record.row_inputs:
        t = case.tensors[k]
        finite = t[torch.isfinite(t)]
        top = float(finite.abs().max()) if finite.numel() else 0.0
        if top > 0:
            t.mul_(2.0 ** -math.floor(math.log2(top)))
    for a in case.record.args:
        if a.kind == "eps":
            case.scalars[a.name] = min(case.scalars[a.name], TELLING_EPS)
    case.notes["telling"] = f"rows scaled to max |x| in [1, 2), eps <= {TELLING_EPS:g}"
    return case


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (rows, n), rows = the product of its leading dims (named: -1 is ambiguous where n = 0)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def check_batch_invariance(session, impl, case, worst):
    """For each S in ``batch_sizes``: a batch of S rows whose row i is the case's row
    (i + shift) mod R (R: the case's rows; each row at several positions, and alone for S = 1)
    gives every row the bits the case's own batch gave it."""
    info = case.record
    rows = _rows(case.main).shape[0]
    per_row = [o.shape == "leading" for o in info.outs]  # one value per row (a scale): a row of width 1
    ref = [_rows(o[..., None] if p else o) for o, p in zip(invoke(session, impl, case), per_row)]
    interpreted = runs_interpreted(session, impl, case.dtype)
    sizes = batch_sizes(case.main.shape[-1], interpreted)
    case.notes["batch sizes"] = "/".join(map(str, sizes))
    if interpreted:
        case.notes["batch sizes scaled"] = INTERPRETED_SCALING
    for size in sizes:
        order = (torch.arange(size, device=case.main.device) + int(case.params["shift"])) % rows
        # fitted: a kernel whose declared domain has no rank 2 gets the batch with a leading 1
        batch = fit(case.replace(**{k: _rows(case.tensors[k])[order] for k in info.row_inputs}), impl.domain)
        for name, a, b, p in zip(info.outputs, ref, invoke(session, impl, batch), per_row):
            differ = (bits(a[order]) != bits(_rows(b[..., None] if p else b))).any(-1)
            if bool(differ.any()):
                i = int(differ.nonzero()[0, 0])
                raise PropertyFailure(f"{name}: row {int(order[i])} of the case's {rows} differs in its bits at "
                                      f"position {i} of a batch of {size} rows from the same row in the case's batch")


def determinism_cases(op, dtype, device, bucket=None):
    return cases(op, dtype, device, profiles=("normal", "lattice"), hostile=False, bucket=bucket)
