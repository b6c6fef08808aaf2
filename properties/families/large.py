"""Large: the sizes where int32 offsets and grid limits break (``--profile large``, on a GPU).

    huge   more than 2^31 elements: 2^31 / w + 64 rows of x-width w (4096, or the op's
           max_width): an offset row * stride held in int32 wraps past element 2^31
    far    2 rows whose row stride is 2^31 + 128 elements: the second row starts past 2^31
           (FlashInfer#3005)

Every row-wise op; each (kernel, dtype) runs both cases once (``buckets.large_buckets``),
no random search.  The kernel runs on the whole tensor and the oracle checks the rows that
matter (``buckets.large_rows_checked``: every row from the last one that starts below
element 2^31, the first row, and 16 random rows below).  The op is row-wise -- output row r
is the op of input row r alone -- so the claim on those rows is the accuracy family's, bound
for bound.  Values: standard normal, made on the device (``strategies.device_normal``).

A dtype whose cases do not fit the device's free memory (``need_bytes``), or that runs out
of it (the kernel's own buffers), is not certified by this family, and says so.  The cases
fill the device, so they run one at a time across xdist workers (``one_at_a_time``).  On
the CPU the test skips and says why.
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import re
import tempfile
import traceback

import torch
from hypothesis import strategies as st

from ...oracle import OPS

from ..search.case import MAX_ELEMENTS, Case, extent
from ..harness.measure import PropertyFailure, check_against_oracle
from ..harness.sandbox import invoke
from ..search.buckets import INT32_LIMIT, integer, large_rows_checked, large_storage, large_stride
from ..search.strategies import device_normal, eps


@st.composite
def large_cases(draw, op, dtype, device, bucket=None, limit=INT32_LIMIT):
    """The case of one of ``buckets.large_buckets(rec, spin, limit)``: row tensors from
    ``device_normal`` with the bucket's ``large_stride``, the other arguments
    the op record's ``sample`` at that width, eps drawn."""
    if bucket is None:
        raise ValueError(f"large_cases({op!r}): bucket must be one of buckets.large_buckets (no random search)")
    rec = OPS[op]
    seed = draw(integer(0, 2 ** 31 - 1, bucket, "seed"))
    rows, x_width = bucket.shape(rec)
    stride = large_stride(rec, bucket, limit)
    base = rec.sample(dtype, device, rows=1, width=x_width, seed=seed)
    tensors = {k: device_normal((rows, x_width), dtype, device, seed + i, stride) if k in rec.row_inputs else base[k]
               for i, k in enumerate(rec.tensors)}
    scalars = {k: base[k] for k in rec.scalars}
    scalars.update({a.name: draw(eps(bucket)) for a in rec.args if a.kind == "eps"})
    checked = large_rows_checked(rows, stride, limit, seed)
    notes = {"seed": str(seed), "bucket": bucket.label, "x": "normal@1e0 (made on the device)",
             "rows checked": f"{len(checked)} of {rows}"}
    return Case(op, tensors, scalars, notes, params={"limit": limit})


def check_large(session, impl, case, worst):
    try:
        _check_rows(session, impl, case, worst)
    except BaseException as e:
        # A failing case too large for a replay file must not outlive its check: Hypothesis keeps
        # the exception and runs the case again, which would hold two on the device.  The finished
        # frames below lose their locals (the outputs); the case keeps its tensors' layout on the
        # meta device, which is all its description and the failure's "not saved" need.
        traceback.clear_frames(e.__traceback__)
        if any(t is not None and extent(t) > MAX_ELEMENTS for t in case.tensors.values()):
            case.tensors.update({k: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                                 for k, t in case.tensors.items() if t is not None})
        raise


def _check_rows(session, impl, case, worst):
    outs = invoke(session, impl, case)
    x = case.main
    rows = large_rows_checked(x.shape[0], x.stride(0), int(case.params["limit"]), int(case.notes["seed"]))
    pick = torch.tensor(rows, device=x.device)
    sub = case.replace(**{k: case.tensors[k].index_select(0, pick) for k in case.record.row_inputs})
    try:
        check_against_oracle(tuple(o.index_select(0, pick) for o in outs), sub, worst)
    except PropertyFailure as e:  # name the case's row, not the index among the rows checked
        raise PropertyFailure(re.sub(r"\[(\d+)", lambda m: f"[{rows[int(m.group(1))]}", str(e), count=1)) from None


def need_bytes(op: str, dtype, bucket, limit: int = INT32_LIMIT) -> int:
    """Device bytes a case of ``bucket`` takes before the kernel's own: its row tensors (twice: the
    sandbox keeps a copy to prove them unmutated) and its outputs."""
    rec = OPS[op]
    rows, x_width = bucket.shape(rec)
    item = torch.empty(0, dtype=dtype).element_size()
    inputs = len(rec.row_inputs) * large_storage(rec, bucket, limit) * item
    outputs = len(rec.outputs) * rows * rec.out_shape((rows, x_width))[-1] * item
    return 2 * inputs + outputs


@contextlib.contextmanager
def one_at_a_time():
    """Hold the device for one large case: an exclusive lock shared by every process of this user
    (xdist workers), and the caching allocator emptied so that free memory is what it says."""
    path = os.path.join(tempfile.gettempdir(), f"normcert-large-{os.getuid()}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # never through a planted link
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        gc.collect()
        torch.cuda.empty_cache()
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)
