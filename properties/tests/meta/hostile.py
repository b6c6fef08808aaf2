"""Hostile kernels: ones that try to get a verdict without being checked.

Each dodges the harness rather than computing a wrong number: refusing cases
with NotImplementedError after passing the probe (or refusing only the probe),
declaring a domain and refusing inside it, exiting the interpreter,
raising from backward, returning a tensor subclass that runs code of its own,
hanging, reusing its output buffers, leaving torch's thread-local modes on
(flush-to-zero among them), writing around the view it is handed.
``test_hostile.py`` asserts the verdict the suite gives each one.
"""
from __future__ import annotations

import threading
import weakref

import torch

from ....impls.eager import rms_norm_gated as eager_rms_norm_gated
from ....impls.eager import up
from ...search.case import extent


def _rms(x, weight, eps):
    xf = up(x)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * up(weight)).to(x.dtype)


def rms_refuses_after_probe(x, weight, eps):
    """Passes the 2x4 probe, then refuses every case it is given."""
    if tuple(x.shape) != (2, 4):
        raise NotImplementedError("only 2x4")
    return _rms(x, weight, eps)


def rms_refuses_long_rows(x, weight, eps):
    """Correct on rows up to 64 elements; refuses longer ones."""
    if x.shape[-1] > 64:
        raise NotImplementedError("rows longer than 64")
    return _rms(x, weight, eps)


def rms_exits(x, weight, eps):
    """Ends the process with status 0 (a test runner would read that as success)."""
    raise SystemExit(0)


class _Exploding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        return _rms(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):
        raise RuntimeError("backward exploded")


def rms_backward_raises(x, weight, eps):
    """A correct forward whose backward raises."""
    return _Exploding.apply(x, weight, eps)


class _Hostile(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("hostile tensor")


def rms_hostile_output(x, weight, eps):
    """A correct result wrapped in a tensor subclass whose every method raises."""
    return _rms(x, weight, eps).as_subclass(_Hostile)


def rms_hangs_on_long_rows(x, weight, eps):
    """Correct on rows up to 64 elements; never returns on longer ones."""
    if x.shape[-1] > 64:
        threading.Event().wait()
    return _rms(x, weight, eps)


def rms_sets_default_dtype(x, weight, eps):
    """A correct result, but it leaves torch's default dtype at float64."""
    torch.set_default_dtype(torch.float64)
    return _rms(x, weight, eps)


def rms_turns_deterministic_on(x, weight, eps):
    """A correct result, but it leaves ``torch.use_deterministic_algorithms(True)`` on for the process."""
    torch.use_deterministic_algorithms(True)
    return _rms(x, weight, eps)


def rms_stops_filling_uninitialized_memory(x, weight, eps):
    """A correct result, but it turns off the NaN fill of ``torch.empty`` under deterministic algorithms."""
    torch.utils.deterministic.fill_uninitialized_memory = False
    return _rms(x, weight, eps)


def rms_leaves_five_threads(x, weight, eps):
    """A correct result, but it leaves its thread's intra-op thread count at 5."""
    torch.set_num_threads(5)
    return _rms(x, weight, eps)


def rms_flushes_denormals(x, weight, eps):
    """A correct result, computed after turning flush-to-zero on for good (in the thread it runs in)."""
    torch.set_flush_denormal(True)
    return _rms(x, weight, eps)


def rms_disables_grad(x, weight, eps):
    """A correct result, computed after switching autograd off for good."""
    torch.set_grad_enabled(False)
    return _rms(x, weight, eps)


_BUFFER: dict = {}


def rms_reused_buffer(x, weight, eps):
    """Writes every result into one static buffer, and its last bit depends on the call count."""
    y = _rms(x, weight, eps)
    buf = _BUFFER.get((y.shape, y.dtype))
    if buf is None:
        buf = _BUFFER[(y.shape, y.dtype)] = torch.empty_like(y)
    _BUFFER["calls"] = _BUFFER.get("calls", 0) + 1
    buf.copy_(y)
    if _BUFFER["calls"] % 2 and buf.numel():
        buf.view(-1)[0] = torch.nextafter(buf.view(-1)[0], torch.tensor(float("inf"), dtype=buf.dtype))
    return buf


def rms_writes_beside_its_view(x, weight, eps):
    """A correct result, but it scribbles on the input's storage just past the view."""
    y = _rms(x, weight, eps)
    storage = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
    end = (x.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))) * x.element_size()
    if storage.numel() > end:
        storage[-1] ^= 1
    return y


def rms_returns_input_view(x, weight, eps):
    """Returns a view of its input (the caller's x and y would share memory)."""
    return x.view_as(x)


_RING: list = []


def rms_ring_of_two(x, weight, eps):
    """A correct result, written into the older of two buffers it keeps and hands out in turn."""
    y = _rms(x, weight, eps)
    _RING[:] = [b for b in _RING if b.shape == y.shape and b.dtype == y.dtype][-2:]
    if len(_RING) < 2:
        _RING.append(torch.empty_like(y))
    _RING.append(_RING.pop(0))
    return _RING[-1].copy_(y)


_ENTERED: list = []


def rms_enters_inference_mode(x, weight, eps):
    """A correct result, computed after entering inference mode and never leaving it."""
    _ENTERED.append(torch.inference_mode())  # kept: a dropped guard would leave the mode by itself
    _ENTERED[-1].__enter__()
    return _rms(x, weight, eps)


def rms_inplace_writes_around_its_view(x, weight, eps):
    """@inplace: y written into x correctly, after zeroing the whole buffer x is a view of
    (the q and v around the k part of a fused QKV buffer)."""
    y = _rms(x, weight, eps)
    torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage()).zero_()
    x.copy_(y)


def rms_inplace_zeroes_span(x, weight, eps):
    """@inplace: y written into x correctly, after a memset over x's storage span, first element to
    last (a sliced row's tail; the v and q between the k rows of a fused QKV buffer)."""
    y = _rms(x, weight, eps)
    torch.as_strided(x, (extent(x),), (1,)).zero_()
    x.copy_(y)


def rms_inplace(x, weight, eps):
    """@inplace, correct: y written into x."""
    x.copy_(_rms(x, weight, eps))


def add_rms_inplace_by_copy(x, residual, weight, eps):
    """@inplace fused add + RMSNorm in plain torch: residual.copy_(s); x.copy_(y).  copy_ records a
    graph through the weight for y and none for residual_out: an inference kernel, not a training one."""
    s = (x.float() + residual.float()).to(x.dtype)
    residual.copy_(s)
    x.copy_(_rms(s, weight, eps))


# ------------------------------------------------------------------ declared domains (issue 22 item 4)
def _multiple_of_8(x, weight, eps):
    if x.shape[-1] % 8:
        raise NotImplementedError("row length not a multiple of 8")
    return _rms(x, weight, eps)


def rms_multiple_of_8_undeclared(x, weight, eps):
    """Correct on rows a multiple of 8 long, refuses the others, and does not say so."""
    return _multiple_of_8(x, weight, eps)


def rms_multiple_of_8(x, weight, eps):
    """The same kernel, its domain declared."""
    return _multiple_of_8(x, weight, eps)


rms_multiple_of_8.normcert_domain = "width_multiple=8"


def rms_half_precision_only(x, weight, eps):
    """A correct RMSNorm for float16 and bfloat16 alone, declared: refuses any other dtype."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError(f"{x.dtype}")
    xf = up(x)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * up(weight, x)).to(x.dtype)


rms_half_precision_only.normcert_domain = "dtypes=float16,bfloat16"


def rms_declares_8_refuses_past_64(x, weight, eps):
    """Declares rows a multiple of 8, and refuses those longer than 64 (inside its domain)."""
    if x.shape[-1] > 64:
        raise NotImplementedError("rows longer than 64")
    return _multiple_of_8(x, weight, eps)


rms_declares_8_refuses_past_64.normcert_domain = "width_multiple=8"


def rms_wrong_past_8192(x, weight, eps):
    """Declares rows of at most 8192 and is wrong (eps outside the root) on rows past 4096."""
    if x.shape[-1] > 4096:
        xf = up(x)
        return (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps) * up(weight)).to(x.dtype)
    return _rms(x, weight, eps)


rms_wrong_past_8192.normcert_domain = {"max_width": 8192, "dtypes": "float32,float16"}


def rms_refuses_the_probe_only(x, weight, eps):
    """Refuses the 2x4 float64 sample and computes float64 in float32 on every other input
    (its float64 results off by float32's roundoff)."""
    if x.dtype == torch.float64 and tuple(x.shape) == (2, 4):
        raise NotImplementedError("float64")
    if x.dtype == torch.float64:
        return _rms(x.float(), weight.float(), eps).double()
    return _rms(x, weight, eps)


def rms_3d_contiguous_only(x, weight, eps):
    """Takes only contiguous (tokens, heads, head_dim) tensors, and declares so."""
    if x.dim() != 3 or not x.is_contiguous():
        raise NotImplementedError(f"a contiguous rank-3 x, not {tuple(x.shape)} strides {x.stride()}")
    return _rms(x, weight, eps)


rms_3d_contiguous_only.normcert_domain = "ranks=3 contiguous=all"


def _gated_after_norm_only(x, z, weight, eps, norm_before_gate, group_size=None):
    """flash-linear-attention's FusedRMSNormGated: y = rms_norm(x) w silu(z), the gate after the norm,
    and nothing else (its groups as the eager kernel takes them)."""
    if not norm_before_gate:
        raise NotImplementedError("gates after the norm only (norm_before_gate=True)")
    return eager_rms_norm_gated(x, z, weight, eps, True, group_size)


def gated_after_norm_only_undeclared(x, z, weight, eps, norm_before_gate, group_size=None):
    """Gates after the norm only, refuses the gate-first cases, and does not say so."""
    return _gated_after_norm_only(x, z, weight, eps, norm_before_gate, group_size)


def gated_after_norm_only(x, z, weight, eps, norm_before_gate, group_size=None):
    """The same kernel, the one value of its flag declared."""
    return _gated_after_norm_only(x, z, weight, eps, norm_before_gate, group_size)


gated_after_norm_only.normcert_domain = "flags=norm_before_gate:yes"


# ------------------------------------------------------------------ kernel code outside the watchdog (item 8)
class _BlockingMessage(RuntimeError):
    def __str__(self):
        threading.Event().wait()  # formatting the error never returns
        return "never"


def rms_error_message_blocks(x, weight, eps):
    """Raises an exception whose ``__str__`` blocks for ever."""
    raise _BlockingMessage()


def rms_output_finalizer_blocks(x, weight, eps):
    """Correct, but its output carries a finalizer that blocks for ever when the output is freed."""
    y = _rms(x, weight, eps)
    weakref.finalize(y, threading.Event().wait)
    return y


def rms_detached_on_the_sample(x, weight, eps):
    """Detaches its output on the 2x4 sample alone: forward-only where the gate looks, a backward
    everywhere else (which would then go unchecked)."""
    y = _rms(x, weight, eps)
    return y.detach() if tuple(x.shape) == (2, 4) else y
