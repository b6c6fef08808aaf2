"""float8_e4m3fn conversions as a GPU does them, for Triton's interpreter (installed by ``interpreter``).

The interpreter keeps a ``tl.float8e4nv`` value as its 8 bit pattern in a numpy
uint8 array and converts with a generic bit shuffle that is wrong for this format
(``interpreter_probes.float8_mismatches``): fp32 -> fp8 drops the sticky bits
(a tie is rounded up, not to even), its carry out of the significand is ORed
into the exponent field (31.0 becomes 16.0), nothing saturates (464 becomes NaN,
+inf 256), and NaN patterns widen to 480.  A GPU's conversion (``cvt.rn.satfinite``
on sm_89+) and torch's cast are:

* **to e4m3fn** from any float format: the exact value rounded to nearest, ties
  to even, subnormals rounded, not flushed; past 448 (±inf included) ±448; NaN
  a NaN (pattern 0x7F with the sign).  ``formats.E4M3.round`` is that rounding.
* **from e4m3fn**: the exact value of the pattern (every one is a float32),
  then the target format's own conversion.

Nothing else changes (the other fp8 formats keep the interpreter's conversions).
"""
from __future__ import annotations

import numpy as np
import torch

from ...oracle.formats import E4M3

VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()  # exact


def encode(v: np.ndarray) -> np.ndarray:
    """Float values (float64, exact) rounded to e4m3fn (saturating), as uint8 patterns."""
    q = E4M3.round(np.asarray(v, dtype=np.float64))
    magnitude = np.abs(E4M3.rank(q)).astype(np.int64)  # e4m3fn's patterns count its values in order
    pattern = np.where(np.isnan(q), 0x7F, magnitude) | np.where(np.signbit(q), 0x80, 0)
    return pattern.astype(np.uint8)


def install() -> None:
    """Make the interpreter convert to and from ``tl.float8e4nv`` as described above (process-wide;
    ``interpreter.install`` calls it once, where its probe shows the defects)."""
    import triton.language as tl  # noqa: PLC0415 - only where Triton is
    from triton.runtime import interpreter as ti  # noqa: PLC0415

    from .interpreter_bf16 import to_bf16, widen  # noqa: PLC0415

    e4, handle, builder = tl.float8e4nv, ti.TensorHandle, ti.InterpreterBuilder
    fp_to_fp = builder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        s, d = src.dtype.scalar, dst_type.scalar
        if e4 not in (s, d) or s == d:
            return fp_to_fp(self, src, dst_type, rounding_mode)
        if d == e4:
            value = widen(src.data) if s == tl.bfloat16 else src.data.astype(np.float64)
            return handle(encode(value), e4)
        value = VALUES[src.data]
        if d == tl.bfloat16:
            return handle(to_bf16(value.astype(np.float32)), d)  # exact: every e4m3fn value is a bf16
        return handle(value.astype(ti._get_np_dtype(d)), d)

    builder.create_fp_to_fp = create_fp_to_fp
