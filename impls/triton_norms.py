"""Triton kernels for RMSNorm, add+RMSNorm, LayerNorm, DeepNorm and masked BatchNorm, forward and backward.

The maths is ``oracle``'s (see ``oracle/rms_norm.py``, ``layer_norm.py``,
``batch_norm.py``); in short, per row of length n (BatchNorm: per channel,
over the valid positions V instead of a row):

    mu   = (1/n) sum_j x_j               (LayerNorm, BatchNorm; 0 for RMSNorm)
    var  = (1/n) sum_j (x_j - mu)**2     (two-pass: mean first, then squares)
    rho  = 1 / sqrt(var + eps)
    xhat = (x - mu) * rho
    y    = xhat * w (+ b)

and for a cotangent dy, with g = dy * w:

    dx = rho * (g - mean(g) - xhat * mean(g * xhat))   (no mean(g) term for RMSNorm)
    dw = sum_rows dy * xhat,   db = sum_rows dy

The row kernels normalise s, formed in the compute precision by a prologue:
s = x, s = x + residual (add+RMSNorm and add+LayerNorm, which also store s rounded as the
residual output), or s = alpha x + f (DeepNorm, f = sublayer(x) computed by
torch beforehand; autograd carries ds through the sublayer, dx = alpha ds + ...).

RMSNorm is the uncentred case of the same kernels: with mu = 0, var is the
mean square and rho * (g - xhat mean(g xhat)) = rho g - rho**3 x mean(g x).

Numerics: every input is widened exactly to the compute precision (float64
for float64 inputs, float32 otherwise), everything is computed there, and each
output is rounded once (nearest-even) to its dtype.  Divisions and the
square root are the correctly rounded ones (``div_rn``, ``sqrt_rn``): on a GPU,
Triton's float32 ``/`` and ``rsqrt`` are approximations.  dweight/dbias are
reduced across rows in the compute precision: each backward program adds its
rows into its own row of a partial-sum buffer, and a second kernel sums those.

Layout: x may have any rank; it is viewed as (rows, n) (a copy only where no
such view exists), and the kernels take both strides of every 2-D operand, so
transposed and sliced inputs are read in place.  Each program holds a tile
of BLOCK_R rows x BLOCK_N columns and loops over column blocks, so rows of
any length work.  The tile depends on n only, never on the number of rows, so
a row gives the same bits alone and inside a batch.

Loads widen with ``.to(ACC)`` and stores round with ``.to(dtype)``, as users'
kernels do; under the Triton interpreter bfloat16 is computed as on a GPU
because normcert corrects the interpreter first (``interpreter_bf16``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..oracle.validate import positive

from . import make

TILE = 2048  # elements per tile: BLOCK_R * BLOCK_N
MAX_PROGRAMS = 256  # backward programs, each owning one row of the dweight/dbias partial sums


# ---------------------------------------------------------------- shared device helpers
@triton.jit
def tile_ptrs(base, row, col, stride_r, stride_c):
    """Pointers to the (row, col) tile of a 2-D operand, with 64-bit offsets."""
    return base + row.to(tl.int64)[:, None] * stride_r + col.to(tl.int64)[None, :] * stride_c


@triton.jit
def load_sum(X, sxr, sxc, R, srr, src, row, col, m, FUSED: tl.constexpr, ACC: tl.constexpr):
    """s = x, or x + residual (FUSED), in ACC at rows ``row`` and columns ``col`` (index tensors
    that broadcast against each other: a (rows, cols) tile, or a (rows, groups, group) one), with
    64-bit offsets; 0 where ``m`` is False."""
    s = tl.load(X + row.to(tl.int64) * sxr + col.to(tl.int64) * sxc, mask=m, other=0.0).to(ACC)
    if FUSED:
        s += tl.load(R + row.to(tl.int64) * srr + col.to(tl.int64) * src, mask=m, other=0.0).to(ACC)
    return s


@triton.jit
def div_rn(a, b):
    """a / b rounded to nearest (Triton's float32 `/` may be an approximate division; float64's is IEEE)."""
    if b.dtype == tl.float32:
        return tl.math.div_rn(a, b)
    else:
        return a / b


@triton.jit
def rsqrt_rn(v):
    """1 / sqrt(v) from a square root and a division each rounded to nearest."""
    if v.dtype == tl.float32:
        root = tl.math.sqrt_rn(v)
    else:
        root = tl.sqrt(v)  # float64: IEEE already
    return div_rn(1.0, root)


@triton.jit
def _sum_partials_kernel(PART, OUT, programs, n, ACC: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT[j] = sum_p PART[p, j] in ACC, rounded once to OUT's dtype."""
    col = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_G, BLOCK_N], ACC)
    for p0 in range(0, programs, BLOCK_G):
        p = p0 + tl.arange(0, BLOCK_G)
        m = (p < programs)[:, None] & (col < n)[None, :]
        acc += tl.load(tile_ptrs(PART, p, col, n, 1), mask=m, other=0.0).to(ACC)
    tl.store(OUT + col, tl.sum(acc, 0).to(OUT.dtype.element_ty), mask=col < n)


# ---------------------------------------------------------------- row norms (RMSNorm, add+RMSNorm, LayerNorm)
@triton.jit
def _load_s(X, sxr, sxc, R, srr, src, alpha, row, col, m, PRE: tl.constexpr, ACC: tl.constexpr):
    """The normalised input s, computed in ACC: x (PRE 0), x + r (PRE 1), alpha x + r (PRE 2)."""
    s = tl.load(tile_ptrs(X, row, col, sxr, sxc), mask=m, other=0.0).to(ACC)
    if PRE == 1:
        s += tl.load(tile_ptrs(R, row, col, srr, src), mask=m, other=0.0).to(ACC)
    if PRE == 2:
        s = alpha * s + tl.load(tile_ptrs(R, row, col, srr, src), mask=m, other=0.0).to(ACC)
    return s


@triton.jit
def _row_xhat(X, sxr, sxc, R, srr, src, alpha, row, col, m, mean, rstd, PRE: tl.constexpr, ACC: tl.constexpr):
    """xhat = (s - mu) * rho on the tile, 0 where masked off (mean and rstd are [BLOCK_R, 1])."""
    return tl.where(m, (_load_s(X, sxr, sxc, R, srr, src, alpha, row, col, m, PRE, ACC) - mean) * rstd, 0.0)


@triton.jit
def _row_norm_fwd_kernel(
    X, sxr, sxc, R, srr, src, ALPHA, W, B, EPS, SCALE, Y, RES, MEAN, RSTD, rows, n,
    CENTER: tl.constexpr, PRE: tl.constexpr, HAS_BIAS: tl.constexpr, QUANT: tl.constexpr,
    ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y = (s - mu) * rho * w (+ b) per row; saves mu (if CENTER) and rho; RES = s rounded (PRE 1).
    QUANT: y / scale, saturated to +-448 (NaN kept) and rounded to Y's float8_e4m3fn."""
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    alpha = tl.load(ALPHA)
    in_rows = row < rows
    n_acc = tl.full([], n, ACC)
    mean = tl.zeros([BLOCK_R], ACC)
    if CENTER:
        acc = tl.zeros([BLOCK_R, BLOCK_N], ACC)
        for c0 in range(0, n, BLOCK_N):
            col = c0 + tl.arange(0, BLOCK_N)
            m = in_rows[:, None] & (col < n)[None, :]
            acc += _load_s(X, sxr, sxc, R, srr, src, alpha, row, col, m, PRE, ACC)
        mean = div_rn(tl.sum(acc, 1), n_acc)
        tl.store(MEAN + row, mean, mask=in_rows)
    acc = tl.zeros([BLOCK_R, BLOCK_N], ACC)
    for c0 in range(0, n, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < n)[None, :]
        s = _load_s(X, sxr, sxc, R, srr, src, alpha, row, col, m, PRE, ACC)
        if PRE == 1:
            tl.store(tile_ptrs(RES, row, col, n, 1), s.to(RES.dtype.element_ty), mask=m)
        d = tl.where(m, s - mean[:, None], 0.0)
        acc += d * d
    rstd = rsqrt_rn(div_rn(tl.sum(acc, 1), n_acc) + tl.load(EPS))
    tl.store(RSTD + row, rstd, mask=in_rows)
    for c0 in range(0, n, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < n)[None, :]
        s = _load_s(X, sxr, sxc, R, srr, src, alpha, row, col, m, PRE, ACC)
        w = tl.load(W + col, mask=col < n, other=0.0).to(ACC)
        y = (s - mean[:, None]) * rstd[:, None] * w[None, :]
        if HAS_BIAS:
            y += tl.load(B + col, mask=col < n, other=0.0).to(ACC)[None, :]
        if QUANT:
            y = tl.clamp(div_rn(y, tl.load(SCALE)), -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(tile_ptrs(Y, row, col, n, 1), y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def add_to_partial(PART, col, in_cols, v):
    """PART[col] += v: this program's own row of a partial-sum buffer."""
    tl.store(PART + col, tl.load(PART + col, mask=in_cols) + v, mask=in_cols)


@triton.jit
def _row_norm_bwd_kernel(
    X, sxr, sxc, R, srr, src, ALPHA, DY, sdr, sdc, DRES, sqr, sqc, W, MEAN, RSTD,
    DX, DW_PART, DB_PART, rows, n, rows_per_prog,
    CENTER: tl.constexpr, PRE: tl.constexpr,
    ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """ds = rho (g - mean(g) - xhat mean(g xhat)) (+ dres for PRE 1), g = dy w, for rows_per_prog rows.

    dw (and db if CENTER) of those rows accumulate into row program_id of DW_PART (DB_PART).
    """
    pid = tl.program_id(0)
    alpha = tl.load(ALPHA)
    n_acc = tl.full([], n, ACC)
    first = pid * rows_per_prog
    last = tl.minimum(first + rows_per_prog, rows)
    dw_part = DW_PART + pid.to(tl.int64) * n
    db_part = DB_PART + pid.to(tl.int64) * n
    for r0 in range(first, last, BLOCK_R):
        row = r0 + tl.arange(0, BLOCK_R)
        in_rows = row < last
        rstd = tl.load(RSTD + row, mask=in_rows, other=0)[:, None]
        mean = tl.zeros([BLOCK_R, 1], ACC)
        if CENTER:
            mean = tl.load(MEAN + row, mask=in_rows, other=0)[:, None]
        sum_g = tl.zeros([BLOCK_R, BLOCK_N], ACC)
        sum_gx = tl.zeros([BLOCK_R, BLOCK_N], ACC)
        for c0 in range(0, n, BLOCK_N):
            col = c0 + tl.arange(0, BLOCK_N)
            m = in_rows[:, None] & (col < n)[None, :]
            xhat = _row_xhat(X, sxr, sxc, R, srr, src, alpha, row, col, m, mean, rstd, PRE, ACC)
            w = tl.load(W + col, mask=col < n, other=0.0).to(ACC)
            g = tl.load(tile_ptrs(DY, row, col, sdr, sdc), mask=m, other=0.0).to(ACC) * w[None, :]
            sum_gx += g * xhat
            if CENTER:
                sum_g += g
        mean_gx = div_rn(tl.sum(sum_gx, 1), n_acc)[:, None]
        mean_g = div_rn(tl.sum(sum_g, 1), n_acc)[:, None]
        for c0 in range(0, n, BLOCK_N):
            col = c0 + tl.arange(0, BLOCK_N)
            in_cols = col < n
            m = in_rows[:, None] & in_cols[None, :]
            xhat = _row_xhat(X, sxr, sxc, R, srr, src, alpha, row, col, m, mean, rstd, PRE, ACC)
            dy = tl.load(tile_ptrs(DY, row, col, sdr, sdc), mask=m, other=0.0).to(ACC)
            w = tl.load(W + col, mask=in_cols, other=0.0).to(ACC)
            dx = rstd * (dy * w[None, :] - mean_g - xhat * mean_gx)
            if PRE == 1:
                dx += tl.load(tile_ptrs(DRES, row, col, sqr, sqc), mask=m, other=0.0).to(ACC)
            tl.store(tile_ptrs(DX, row, col, n, 1), dx.to(DX.dtype.element_ty), mask=m)
            add_to_partial(dw_part, col, in_cols, tl.sum(dy * xhat, 0))
            if CENTER:
                add_to_partial(db_part, col, in_cols, tl.sum(dy, 0))


# ---------------------------------------------------------------- BatchNorm (statistics per channel)
@triton.jit
def _valid_positions(MASK, pos, P, HAS_MASK: tl.constexpr):
    """Positions inside [0, P) whose mask is set (all of them without a mask)."""
    valid = pos < P
    if HAS_MASK:
        valid = valid & (tl.load(MASK + pos, mask=valid, other=0) != 0)
    return valid


@triton.jit
def _bn_xhat(X, sxp, sxc, pos, col, m, mean, rstd, ACC: tl.constexpr):
    """xhat = (x - mu) * rho on the tile, 0 where masked off (x is not read there)."""
    x = tl.load(tile_ptrs(X, pos, col, sxp, sxc), mask=m, other=0.0).to(ACC)
    return tl.where(m, (x - mean[None, :]) * rstd[None, :], 0.0)


@triton.jit
def _bn_fwd_kernel(
    X, sxp, sxc, MASK, W, B, EPS, Y, MEAN, RSTD, P, C,
    HAS_MASK: tl.constexpr, ACC: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Per channel: mu, rho over the valid positions (two-pass); y = xhat w + b there, 0 at padded positions.

    x is read at valid positions only (padded ones may hold NaN or inf).  The
    padded outputs are constant, so their cotangents truly do not matter and the
    backward (which ignores them) is the exact derivative of this forward.
    """
    col = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_cols = col < C
    acc = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    count = tl.zeros([BLOCK_P], ACC)
    for p0 in range(0, P, BLOCK_P):
        pos = p0 + tl.arange(0, BLOCK_P)
        valid = _valid_positions(MASK, pos, P, HAS_MASK)
        m = valid[:, None] & in_cols[None, :]
        acc += tl.load(tile_ptrs(X, pos, col, sxp, sxc), mask=m, other=0.0).to(ACC)
        count += valid.to(ACC)
    count_all = tl.sum(count, 0)
    mean = div_rn(tl.sum(acc, 0), count_all)
    acc = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    for p0 in range(0, P, BLOCK_P):
        pos = p0 + tl.arange(0, BLOCK_P)
        m = _valid_positions(MASK, pos, P, HAS_MASK)[:, None] & in_cols[None, :]
        x = tl.load(tile_ptrs(X, pos, col, sxp, sxc), mask=m, other=0.0).to(ACC)
        d = tl.where(m, x - mean[None, :], 0.0)
        acc += d * d
    rstd = rsqrt_rn(div_rn(tl.sum(acc, 0), count_all) + tl.load(EPS))
    tl.store(MEAN + col, mean, mask=in_cols)
    tl.store(RSTD + col, rstd, mask=in_cols)
    w = tl.load(W + col, mask=in_cols, other=0.0).to(ACC)[None, :]
    b = tl.load(B + col, mask=in_cols, other=0.0).to(ACC)[None, :]
    for p0 in range(0, P, BLOCK_P):
        pos = p0 + tl.arange(0, BLOCK_P)
        m = _valid_positions(MASK, pos, P, HAS_MASK)[:, None] & in_cols[None, :]
        xhat = _bn_xhat(X, sxp, sxc, pos, col, m, mean, rstd, ACC)
        inside = (pos < P)[:, None] & in_cols[None, :]
        y = tl.where(m, xhat * w + b, 0.0)
        tl.store(tile_ptrs(Y, pos, col, C, 1), y.to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _bn_bwd_kernel(
    X, sxp, sxc, MASK, DY, sdp, sdc, W, MEAN, RSTD, DX, DW, DB, P, C,
    HAS_MASK: tl.constexpr, ACC: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Per channel over the valid positions V: db = sum_V dy, dw = sum_V dy xhat,
    dx = rho (g - w db / |V| - xhat w dw / |V|) with g = dy w on V, dx = 0 at padded positions.

    dy is read at valid positions only.
    """
    col = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_cols = col < C
    mean = tl.load(MEAN + col, mask=in_cols, other=0)
    rstd = tl.load(RSTD + col, mask=in_cols, other=0)
    w = tl.load(W + col, mask=in_cols, other=0.0).to(ACC)
    sum_dy = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    sum_dyx = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    count = tl.zeros([BLOCK_P], ACC)
    for p0 in range(0, P, BLOCK_P):
        pos = p0 + tl.arange(0, BLOCK_P)
        valid = _valid_positions(MASK, pos, P, HAS_MASK)
        m = valid[:, None] & in_cols[None, :]
        xhat = _bn_xhat(X, sxp, sxc, pos, col, m, mean, rstd, ACC)
        dy = tl.load(tile_ptrs(DY, pos, col, sdp, sdc), mask=m, other=0.0).to(ACC)
        sum_dy += dy
        sum_dyx += dy * xhat
        count += valid.to(ACC)
    db = tl.sum(sum_dy, 0)
    dw = tl.sum(sum_dyx, 0)
    tl.store(DB + col, db.to(DB.dtype.element_ty), mask=in_cols)
    tl.store(DW + col, dw.to(DW.dtype.element_ty), mask=in_cols)
    count_all = tl.sum(count, 0)
    mean_g = div_rn(w * db, count_all)[None, :]
    mean_gx = div_rn(w * dw, count_all)[None, :]
    for p0 in range(0, P, BLOCK_P):
        pos = p0 + tl.arange(0, BLOCK_P)
        m = _valid_positions(MASK, pos, P, HAS_MASK)[:, None] & in_cols[None, :]
        xhat = _bn_xhat(X, sxp, sxc, pos, col, m, mean, rstd, ACC)
        dy = tl.load(tile_ptrs(DY, pos, col, sdp, sdc), mask=m, other=0.0).to(ACC)
        dx = tl.where(m, rstd[None, :] * (dy * w[None, :] - mean_g - xhat * mean_gx), 0.0)
        inside = (pos < P)[:, None] & in_cols[None, :]
        tl.store(tile_ptrs(DX, pos, col, C, 1), dx.to(DX.dtype.element_ty), mask=inside)


# ---------------------------------------------------------------- host helpers (shared with triton_swiglu)
def compute_dtype(dtype: torch.dtype) -> tuple[tl.dtype, torch.dtype]:
    """The compute precision (Triton, torch): float64 stays float64, the rest is float32."""
    return (tl.float64, torch.float64) if dtype == torch.float64 else (tl.float32, torch.float32)


def as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """t as a 2-D (rows, n) tensor: a view where one exists, else a copy (t itself never changes)."""
    return t.reshape(math.prod(t.shape[:-1]), n)


def tile(n: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_N) for rows of length n: a function of n alone."""
    block_n = min(triton.next_power_of_2(max(n, 1)), TILE)
    return TILE // block_n, block_n


def column_sums(part: torch.Tensor, dtype: torch.dtype, acc: tl.dtype) -> torch.Tensor:
    """Sum the rows of a (programs, n) partial-sum buffer, rounded once to dtype."""
    programs, n = part.shape
    out = torch.empty(n, dtype=dtype, device=part.device)
    block_n = min(triton.next_power_of_2(max(n, 1)), 256)
    _sum_partials_kernel[(triton.cdiv(n, block_n),)](part, out, programs, n, ACC=acc, BLOCK_G=TILE // block_n,
                                                      BLOCK_N=block_n)
    return out


def scalar(v: float, dtype: torch.dtype, device) -> torch.Tensor:
    """eps or alpha as a one-element tensor: Triton would pass a Python float as float32."""
    return torch.full((1,), v, dtype=dtype, device=device)


def _prologue(residual, alpha) -> int:
    """PRE: s = x (0), x + residual (1, residual_out stored), alpha x + residual (2, DeepNorm)."""
    return 0 if residual is None else (1 if alpha is None else 2)


def _row_norm_forward(x, residual, weight, bias, eps, center, alpha=None, scale=None):
    """(y, residual_out or None, mean or None, rstd) for the row norms; with a ``scale``, y is
    quantised to float8_e4m3fn (y / scale, saturating)."""
    n = x.shape[-1]
    pre = _prologue(residual, alpha)
    acc, acc_t = compute_dtype(x.dtype)
    x2 = as_rows(x, n)
    r2 = x2 if residual is None else as_rows(residual, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype if scale is None else torch.float8_e4m3fn, device=x.device)
    res = torch.empty((rows, n), dtype=residual.dtype, device=x.device) if pre == 1 else None  # float32 stream too
    mean = torch.empty(rows, dtype=acc_t, device=x.device) if center else None
    rstd = torch.empty(rows, dtype=acc_t, device=x.device)
    if rows * n:
        block_r, block_n = tile(n)
        w = weight.contiguous()
        b = w if bias is None else bias.contiguous()
        eps_t = scalar(eps, acc_t, x.device)
        _row_norm_fwd_kernel[(triton.cdiv(rows, block_r),)](
            x2, x2.stride(0), x2.stride(1), r2, r2.stride(0), r2.stride(1), scalar(1.0 if alpha is None else alpha, acc_t, x.device),
            w, b, eps_t, eps_t if scale is None else scalar(scale, acc_t, x.device),  # SCALE is read only if QUANT
            y, y if res is None else res, rstd if mean is None else mean, rstd,
            rows, n, CENTER=center, PRE=pre, HAS_BIAS=bias is not None, QUANT=scale is not None,
            ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)
    res = None if res is None else res.reshape(x.shape)
    return y.reshape(x.shape), res, mean, rstd


def _row_norm_backward(x, residual, weight, mean, rstd, dy, dres, bias_dtype=None, alpha=None):
    """(ds, dweight, dbias or None), ds the cotangent of s (+ dres); centred (LayerNorm) when mean is given.
    ds is stored in the wider of x's and a residual stream's dtype: a float32 stream's gradient
    must not pass through float16 (past 65504 it would overflow)."""
    n = x.shape[-1]
    acc, acc_t = compute_dtype(x.dtype)
    x2, dy2 = as_rows(x, n), as_rows(dy, n)
    r2 = x2 if residual is None else as_rows(residual, n)
    dres2 = dy2 if dres is None else as_rows(dres, n)
    rows = x2.shape[0]
    wide = residual is not None and alpha is None and torch.finfo(residual.dtype).bits > torch.finfo(x.dtype).bits
    dx = torch.empty((rows, n), dtype=residual.dtype if wide else x.dtype, device=x.device)
    center = mean is not None
    if rows * n == 0:
        dw = torch.zeros_like(weight)
        db = torch.zeros(n, dtype=bias_dtype, device=x.device) if center else None
        return dx.reshape(x.shape), dw, db
    block_r, block_n = tile(n)
    tiles = triton.cdiv(rows, block_r)
    rows_per_prog = triton.cdiv(tiles, min(tiles, MAX_PROGRAMS)) * block_r
    programs = triton.cdiv(rows, rows_per_prog)
    dw_part = torch.zeros((programs, n), dtype=acc_t, device=x.device)
    db_part = torch.zeros((programs, n), dtype=acc_t, device=x.device) if center else dw_part
    _row_norm_bwd_kernel[(programs,)](
        x2, x2.stride(0), x2.stride(1), r2, r2.stride(0), r2.stride(1), scalar(1.0 if alpha is None else alpha, acc_t, x.device),
        dy2, dy2.stride(0), dy2.stride(1),
        dres2, dres2.stride(0), dres2.stride(1), weight.contiguous(), rstd if mean is None else mean, rstd,
        dx, dw_part, db_part, rows, n, rows_per_prog,
        CENTER=center, PRE=_prologue(residual, alpha), ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)
    dw = column_sums(dw_part, weight.dtype, acc)
    db = column_sums(db_part, bias_dtype, acc) if center else None
    return dx.reshape(x.shape), dw, db


def _ones_for_none(weight, x):
    """A weightless call's weight: ones in x's dtype (multiplying by 1 is exact)."""
    return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device) if weight is None else weight


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        w = _ones_for_none(weight, x)
        y, _, _, rstd = _row_norm_forward(x, None, w, None, eps, center=False)
        ctx.save_for_backward(x, w, rstd)
        ctx.has_weight = weight is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw, _ = _row_norm_backward(x, None, weight, None, rstd, dy, None)
        return dx, dw if ctx.has_weight else None, None


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, res, _, rstd = _row_norm_forward(x, residual, weight, None, eps, center=False)
        ctx.save_for_backward(x, residual, weight, rstd)
        return y, res

    @staticmethod
    def backward(ctx, dy, dres):
        x, residual, weight, rstd = ctx.saved_tensors
        ds, dw, _ = _row_norm_backward(x, residual, weight, None, rstd, dy, dres)
        return ds.to(x.dtype), ds.to(residual.dtype, copy=True) if ctx.needs_input_grad[1] else None, dw, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        w = _ones_for_none(weight, x)
        y, _, mean, rstd = _row_norm_forward(x, None, w, bias, eps, center=True)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.bias_dtype = x.dtype if bias is None else bias.dtype
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = _row_norm_backward(x, None, weight, mean, rstd, dy, None, ctx.bias_dtype)
        return dx, dw if ctx.has_weight else None, db if ctx.has_bias else None, None


class _AddLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps):
        y, res, mean, rstd = _row_norm_forward(x, residual, weight, bias, eps, center=True)
        ctx.save_for_backward(x, residual, weight, mean, rstd)
        ctx.bias_dtype = bias.dtype
        return y, res

    @staticmethod
    def backward(ctx, dy, dres):
        x, residual, weight, mean, rstd = ctx.saved_tensors
        ds, dw, db = _row_norm_backward(x, residual, weight, mean, rstd, dy, dres, ctx.bias_dtype)
        return ds.to(x.dtype), ds.to(residual.dtype, copy=True) if ctx.needs_input_grad[1] else None, dw, db, None


class _DeepNorm(torch.autograd.Function):
    """layer_norm(alpha x + f) with f = sublayer(x) given: the sum is formed in the kernel (in ACC)."""

    @staticmethod
    def forward(ctx, x, f, alpha, weight, bias, eps):
        y, _, mean, rstd = _row_norm_forward(x, f, weight, bias, eps, center=True, alpha=alpha)
        ctx.save_for_backward(x, f, weight, mean, rstd)
        ctx.alpha, ctx.bias_dtype = alpha, bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, f, weight, mean, rstd = ctx.saved_tensors
        dz, dw, db = _row_norm_backward(x, f, weight, mean, rstd, dy, None, ctx.bias_dtype, alpha=ctx.alpha)
        return ctx.alpha * dz, dz, None, dw, db, None  # autograd carries dz on through the sublayer


def _bn_tile(p: int, c: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) for p positions of c channels: up to 64 channels per program and the
    rest of the tile along positions; with fewer positions than that, wider column blocks
    (fewer programs: 1 x 16384 is 8 programs, not 256)."""
    block_p = min(triton.next_power_of_2(max(p, 1)), TILE // min(triton.next_power_of_2(c), 64))
    return block_p, min(triton.next_power_of_2(c), TILE // block_p)


def _batch_norm_forward(x, weight, bias, eps, mask):
    """(y, mean, rstd, mask as uint8 or None); mean and rstd per channel."""
    c = x.shape[-1]
    acc, acc_t = compute_dtype(x.dtype)
    x2 = as_rows(x, c)
    p = x2.shape[0]
    m = None if mask is None else mask.reshape(-1).contiguous().view(torch.uint8)
    y = torch.empty((p, c), dtype=x.dtype, device=x.device)
    mean = torch.empty(c, dtype=acc_t, device=x.device)
    rstd = torch.empty_like(mean)
    if p * c:
        block_p, block_c = _bn_tile(p, c)
        _bn_fwd_kernel[(triton.cdiv(c, block_c),)](
            x2, x2.stride(0), x2.stride(1), x2 if m is None else m, weight.contiguous(), bias.contiguous(),
            scalar(eps, acc_t, x.device), y, mean, rstd, p, c,
            HAS_MASK=m is not None, ACC=acc, BLOCK_P=block_p, BLOCK_C=block_c)
    return y.reshape(x.shape), mean, rstd, m


def _batch_norm_backward(x, weight, bias_dtype, mean, rstd, m, dy):
    """(dx, dweight, dbias)."""
    c = x.shape[-1]
    x2, dy2 = as_rows(x, c), as_rows(dy, c)
    p = x2.shape[0]
    dx = torch.empty((p, c), dtype=x.dtype, device=x.device)
    dw = torch.zeros(c, dtype=weight.dtype, device=x.device)
    db = torch.zeros(c, dtype=bias_dtype, device=x.device)
    if p * c:
        block_p, block_c = _bn_tile(p, c)
        _bn_bwd_kernel[(triton.cdiv(c, block_c),)](
            x2, x2.stride(0), x2.stride(1), x2 if m is None else m, dy2, dy2.stride(0), dy2.stride(1),
            weight.contiguous(), mean, rstd, dx, dw, db, p, c,
            HAS_MASK=m is not None, ACC=compute_dtype(x.dtype)[0], BLOCK_P=block_p, BLOCK_C=block_c)
    return dx.reshape(x.shape), dw, db


class _BatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, mask):
        y, mean, rstd, m = _batch_norm_forward(x, weight, bias, eps, mask)
        ctx.save_for_backward(x, weight, mean, rstd, m)
        ctx.bias_dtype = bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd, m = ctx.saved_tensors
        dx, dw, db = _batch_norm_backward(x, weight, ctx.bias_dtype, mean, rstd, m, dy)
        return dx, dw, db, None, None


# ---------------------------------------------------------------- the ops
def rms_norm(x, weight, eps):
    return _RMSNorm.apply(x, weight, eps)


def gemma_rms_norm(x, weight, eps):
    """rms_norm's kernels at weight 1 + w, the offset added in the compute format (float32, or
    float64 for float64 x) by torch before the kernel; autograd casts dw back to w's dtype."""
    c = torch.float64 if x.dtype == torch.float64 else torch.float32
    return _RMSNorm.apply(x, weight.to(c) + 1, eps)


def add_rms_norm(x, residual, weight, eps):
    return _AddRMSNorm.apply(x, residual, weight, eps)


def layer_norm(x, weight, bias, eps):
    return _LayerNorm.apply(x, weight, bias, eps)


def add_layer_norm(x, residual, weight, bias, eps):
    return _AddLayerNorm.apply(x, residual, weight, bias, eps)


def deep_norm(x, sublayer, alpha, weight, bias, eps):
    return _DeepNorm.apply(x, sublayer(x), alpha, weight, bias, eps)


def batch_norm(x, weight, bias, eps, mask=None):
    return _BatchNorm.apply(x, weight, bias, eps, mask)


def _fp8_scale(op: str, x, scale) -> None:
    """A positive finite scale (ValueError naming it); float64 x is not supported: a GPU has no
    float64 -> e4m3fn conversion that rounds once (it would go through float32)."""
    positive(op, "scale", scale)
    if x.dtype == torch.float64:
        raise NotImplementedError(f"{op}: float64 input (no single-rounding float64 -> float8_e4m3fn conversion)")


def rms_norm_fp8(x, weight, eps, scale):
    """rms_norm's forward kernel with its output divided by scale and stored as float8_e4m3fn
    (inference only: no backward)."""
    _fp8_scale("rms_norm_fp8", x, scale)
    return _row_norm_forward(x, None, weight, None, eps, center=False, scale=scale)[0]


def add_rms_norm_fp8(x, residual, weight, eps, scale):
    """add_rms_norm's forward kernel, y quantised as rms_norm_fp8's; residual_out in the residual's dtype."""
    _fp8_scale("add_rms_norm_fp8", x, scale)
    y, res, _, _ = _row_norm_forward(x, residual, weight, None, eps, center=False, scale=scale)
    return y, res


# a GPU has no float64 -> float8_e4m3fn conversion that rounds once (``_fp8_scale``)
_NO_FLOAT64 = "dtypes=float32,float16,bfloat16"

IMPLS = [
    make("rms_norm", "triton", "triton", rms_norm, devices=("cpu", "cuda")),
    make("gemma_rms_norm", "triton", "triton", gemma_rms_norm, devices=("cpu", "cuda")),
    make("add_rms_norm", "triton", "triton", add_rms_norm, devices=("cpu", "cuda")),
    make("rms_norm_fp8", "triton", "triton", rms_norm_fp8, devices=("cpu", "cuda"), domain=_NO_FLOAT64),
    make("add_rms_norm_fp8", "triton", "triton", add_rms_norm_fp8, devices=("cpu", "cuda"), domain=_NO_FLOAT64),
    make("layer_norm", "triton", "triton", layer_norm, devices=("cpu", "cuda")),
    make("add_layer_norm", "triton", "triton", add_layer_norm, devices=("cpu", "cuda")),
    make("batch_norm", "triton", "triton", batch_norm, devices=("cpu", "cuda")),
    make("deep_norm", "triton", "triton", deep_norm, devices=("cpu", "cuda")),
]
