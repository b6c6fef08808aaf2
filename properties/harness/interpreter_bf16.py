"""bfloat16 as a GPU computes it, for Triton's interpreter (installed by ``interpreter``).

The interpreter keeps a bfloat16 value as its 16 bit pattern b in a numpy
uint16 array.  Its value is the float32 whose pattern is b·2¹⁶, exactly
(``widen``).  What a GPU does with such values, and what this module makes the
interpreter do:

* **fp32 → bf16** (``.to(tl.bfloat16)``, ``cvt.rn.bf16.f32``): round to nearest,
  ties to even, over the whole range: subnormal results are rounded, not
  flushed; a value at or past the midpoint above the largest finite bf16
  becomes ±inf; a NaN stays a quiet NaN.  ``rounding="rtz"`` truncates.
  From float64 (and from integers, through float64) the rounding is one
  rounding of the exact value: the float64 is first rounded to float32 *to
  odd*, which keeps the bits a later rounding to 8 bits needs (24 ≥ 8 + 2).
* **bf16 → anything**: the exact value (``widen``), then that format's own
  conversion.
* **arithmetic** (+, −, ×, min, max, clamp) on two bf16 operands: the exact
  result rounded once to bf16, as the hardware's ``add.rn.bf16`` gives and as a
  GPU without it gives by computing in fp32 and rounding: the operands are
  widened, combined in float32 and rounded to bf16.  The float32 step is
  itself rounded, but a double rounding through p' ≥ 2p + 2 bits (24 ≥ 18) is
  innocuous for +, −, ×, so the result is the correctly rounded one.  A fused
  multiply-add is rounded once from the exact a·b + c.
* **comparisons** on the values, not the patterns.
* **reductions** (``tl.sum``, ``tl.cumsum``, ``tl.cumprod``, min, max) in bf16: every
  combining step is rounded to bf16, as a GPU's reduction tree does.  The
  pairing is a balanced tree; a GPU's pairing differs, which the error model
  allows (it bounds every summation order).
* **constants** ``tl.full(..., v, tl.bfloat16)`` and bf16 scalars: v rounded once.
* **tl.dot** on bf16 operands: the exact products, accumulated in the
  accumulator's format.

Nothing else changes: float8 formats keep the interpreter's own conversions.
"""
from __future__ import annotations

import numpy as np

QUIET = np.uint32(0x0040)  # the quiet bit of a bf16 NaN


def widen(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bf16 patterns (exact: bf16 is float32 with 16 fewer significand bits)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(v: np.ndarray, rounding: str) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    bits = v.view(np.uint32)
    if rounding == "rtz":
        top = bits >> 16
    else:  # nearest even: add half an ulp less one, plus the lowest kept bit
        top = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return np.where(np.isnan(v), (bits >> 16) | QUIET, top).astype(np.uint16)


def _toward_zero_f32(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 → float32 rounded toward zero (past the largest float32: it), and where that was inexact."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = v.astype(np.float32)
        r = np.where(np.abs(r.astype(np.float64)) > np.abs(v), np.nextafter(r, np.float32(0)), r)
        return r, (r.astype(np.float64) != v) & np.isfinite(v)


def _to_odd_f32(v: np.ndarray) -> np.ndarray:
    """float64 → float32 rounded to odd: exact values stay; others become the odd one of the two
    float32 neighbours (the one toward zero with its last bit set)."""
    r, inexact = _toward_zero_f32(v)  # NaN and ±inf come through as themselves, exact
    return (r.view(np.uint32) | np.where(inexact, np.uint32(1), np.uint32(0))).view(np.float32)


def to_bf16(v, rounding: str = "rtne") -> np.ndarray:
    """bf16 patterns of the values v (any real numpy dtype), one rounding of each exact value."""
    v = np.asarray(v)
    if v.dtype == np.float32:
        return _f32_to_bf16(v, rounding)
    exact = v.astype(np.float64)
    if rounding == "rtz":  # toward zero twice is toward zero once
        return _f32_to_bf16(_toward_zero_f32(exact)[0], "rtz")
    return _f32_to_bf16(_to_odd_f32(exact), rounding)


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """bf16 patterns of a·b + c rounded once (a·b is exact in float64; the sum's error is recovered
    exactly by TwoSum and folded in by rounding to odd, then to bf16)."""
    p = widen(a).astype(np.float64) * widen(b).astype(np.float64)
    z = widen(c).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + z
        t = s - p
        err = (p - (s - t)) + (z - t)
        odd = np.where(np.isfinite(s) & (err != 0) & ((s.view(np.uint64) & np.uint64(1)) == 0),
                       np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return to_bf16(odd)


def tree_reduce(bits: np.ndarray, axis, keepdims: bool, combine) -> np.ndarray:
    """Reduce bf16 patterns along axis (None: all) by a balanced tree, each step rounded to bf16."""
    v = widen(bits)
    ndim = v.ndim
    v = np.moveaxis(v.reshape(-1) if axis is None else v, 0 if axis is None else axis, -1)
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        with np.errstate(all="ignore"):
            paired = widen(to_bf16(combine(v[..., :h], v[..., h:2 * h])))
        v = np.concatenate([paired, v[..., 2 * h:]], axis=-1)
    out = to_bf16(v[..., 0])
    if keepdims:
        return out.reshape((1,) * ndim) if axis is None else np.expand_dims(out, axis)
    return out


def sequential_scan(bits: np.ndarray, axis: int, combine) -> np.ndarray:
    """Inclusive scan of bf16 patterns along axis, each step rounded to bf16."""
    v = np.moveaxis(widen(bits), axis, 0).copy()
    with np.errstate(all="ignore"):
        for i in range(1, v.shape[0]):
            v[i] = widen(to_bf16(combine(v[i - 1], v[i])))
    return np.moveaxis(to_bf16(v), 0, axis)


def install() -> None:
    """Make the interpreter compute bfloat16 as described above (process-wide; ``interpreter.install``
    calls it once, where its probe shows the defects)."""
    import triton.language as tl  # noqa: PLC0415 - only where Triton is
    from triton.runtime import interpreter as ti  # noqa: PLC0415

    bf16, handle, builder = tl.bfloat16, ti.TensorHandle, ti.InterpreterBuilder
    rtz = ti._ir.ROUNDING_MODE.RTZ
    cast, fp_to_fp, binary, unary, ternary = (builder.cast_impl, builder.create_fp_to_fp, builder.binary_op,
                                              builder.unary_op, builder.ternary_op)
    fused, dot = builder.create_fma, builder.create_dot
    reduce_sum, reduce_min_max = ti.ReduceOps.sum, ti.ReduceOps.min_max
    cumsum, cumprod = ti.ScanOps.cumsum, ti.ScanOps.cumprod

    def convert(src, dst, rounding):
        if src.dtype.scalar == bf16 and dst == bf16:
            return handle(src.data, bf16)
        if dst == bf16:
            return handle(to_bf16(src.data, rounding), bf16)
        with np.errstate(all="ignore"):
            return handle(widen(src.data).astype(ti._get_np_dtype(dst)), dst)

    def cast_impl(self, src, dst_type):
        if bf16 not in (src.dtype.scalar, dst_type.scalar):
            return cast(self, src, dst_type)
        return convert(src, dst_type.scalar, "rtne")

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        kinds = (src.dtype.scalar, dst_type.scalar)
        if bf16 not in kinds or any(k.is_fp8() for k in kinds):
            return fp_to_fp(self, src, dst_type, rounding_mode)
        return convert(src, dst_type.scalar, "rtz" if rounding_mode == rtz else "rtne")

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar != bf16:
            return binary(self, lhs, rhs, op)
        with np.errstate(all="ignore"):
            out = op(widen(lhs.data), widen(rhs.data))
        # arithmetic gives float32 (rounded once more, to bf16); a comparison gives booleans
        return handle(to_bf16(out), bf16) if out.dtype == np.float32 else handle(out, tl.int1)

    def unary_op(self, arg, op):
        if arg.dtype.scalar != bf16:
            return unary(self, arg, op)
        with np.errstate(all="ignore"):
            return handle(to_bf16(op(widen(arg.data))), bf16)

    def ternary_op(self, lhs, rhs, other, op):
        if op is not np.clip or other.dtype.scalar != bf16:
            return ternary(self, lhs, rhs, other, op)
        return handle(to_bf16(np.clip(widen(lhs.data), widen(rhs.data), widen(other.data))), bf16)

    def create_fma(self, x, y, z):
        if z.dtype.scalar != bf16:
            return fused(self, x, y, z)
        return handle(fma(x.data, y.data, z.data), bf16)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if bf16 in (a.dtype.scalar, b.dtype.scalar):
            a, b = (handle(widen(h.data), tl.float32) if h.dtype.scalar == bf16 else h for h in (a, b))
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def get_bf16(self, value):
        return handle(to_bf16(np.array([value], dtype=np.float64)), bf16)

    def as_float32(t):
        shape = [int(s) for s in t.shape]
        return tl.core.tensor(handle(widen(t.handle.data), tl.float32),
                              tl.block_type(tl.float32, shape) if shape else tl.float32)

    def sum_(self, input):
        if input.dtype != bf16:
            return reduce_sum(self, input)
        return self.to_tensor(tree_reduce(input.handle.data, self.axis, self.keep_dims, np.add), bf16)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        input = input[0] if isinstance(input, tuple) else input
        if input.dtype != bf16:
            return reduce_min_max(self, input, val_reduce_op, idx_reduce_op)
        got = reduce_min_max(self, as_float32(input), val_reduce_op, idx_reduce_op)
        back = (lambda t: self.to_tensor(to_bf16(t.handle.data), bf16) if t.dtype == tl.float32 else t)
        return tuple(back(t) for t in got) if isinstance(got, tuple) else back(got)

    def scan(original, combine):
        def run(self, input):
            if input.dtype != bf16:
                return original(self, input)
            return [self.to_tensor(sequential_scan(input.handle.data, self.axis, combine), bf16)]
        return run

    for name, value in (("cast_impl", cast_impl), ("create_fp_to_fp", create_fp_to_fp), ("binary_op", binary_op),
                        ("unary_op", unary_op), ("ternary_op", ternary_op), ("create_fma", create_fma),
                        ("create_dot", create_dot), ("get_bf16", get_bf16)):
        setattr(builder, name, value)
    ti.ReduceOps.sum, ti.ReduceOps.min_max = sum_, min_max
    ti.ScanOps.cumsum, ti.ScanOps.cumprod = scan(cumsum, np.add), scan(cumprod, np.multiply)
