"""Kernels right in the context a test calls them in and wrong in one a model does (``search.context``):
one bug per context field, each with a correct twin that takes the same dispatch.

Each is an rms_norm(x, weight, eps), y = x rho w with rho = (mean(x^2) + eps)^(-1/2), and every
backward is the exact one, dx = rho (g - xhat mean(g xhat)), g = dy w, xhat = x rho, dw = sum_rows dy xhat,
unless its docstring says otherwise.  ``BUGS`` says which family kills each and the context its
shrunk counterexample names.
"""
from __future__ import annotations

import threading
import weakref

import torch

from ....impls.eager import rms_norm as eager_rms_norm, up


def _weight(x, weight):
    return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device) if weight is None else weight


class _Rms(torch.autograd.Function):
    """RMSNorm by hand.  ``drop`` (forward only): the weight left out of y, its backward still the
    exact one of x rho w; ``frozen``: without dw asked (``needs_input_grad[1]`` False), dx = rho g,
    the rms term dropped; ``row_major``: dy read from its storage as if contiguous; ``contiguous``:
    dy made contiguous first, then read so."""

    @staticmethod
    def forward(ctx, x, weight, eps, drop=False, frozen=False, row_major=False):
        xf = up(x)  # the compute format: float32, float64 for float64
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, inv)
        ctx.bugs = (frozen, row_major)
        return (xf * inv * (1.0 if drop else up(weight, x))).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, inv = ctx.saved_tensors
        frozen, row_major = ctx.bugs
        if row_major:
            dy = dy.contiguous() if row_major == "contiguous" else \
                torch.as_strided(dy, dy.shape, _row_major(dy.shape), dy.storage_offset())
        xf, g = up(x), up(dy, x) * up(weight, x)
        xhat = xf * inv
        if frozen and not ctx.needs_input_grad[1]:
            return (inv * g).to(x.dtype), None, None, None, None, None
        dx = inv * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (up(dy, x) * xhat).reshape(-1, x.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        return dx.to(x.dtype), None if dw is None else dw.to(weight.dtype), None, None, None, None


def _row_major(shape):
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


def rms_training_drops_weight(x, weight, eps):
    """A fused path for inference and an autograd.Function for training (x.requires_grad), whose
    forward leaves the weight out; its backward is exact."""
    if x.requires_grad:
        return _Rms.apply(x, _weight(x, weight), eps, True)
    return eager_rms_norm(x, weight, eps)


def rms_training_twin(x, weight, eps):
    """The same dispatch, the training forward right."""
    if x.requires_grad:
        return _Rms.apply(x, _weight(x, weight), eps)
    return eager_rms_norm(x, weight, eps)


def rms_trainable_weight_drops_weight(x, weight, eps):
    """Keyed on weight.requires_grad alone (a model evaluated under no_grad with trainable
    parameters takes it too): that path's forward leaves the weight out."""
    if weight is not None and weight.requires_grad:
        return _Rms.apply(x, weight, eps, True)
    return eager_rms_norm(x, weight, eps)


def rms_trainable_weight_twin(x, weight, eps):
    if weight is not None and weight.requires_grad:
        return _Rms.apply(x, weight, eps)
    return eager_rms_norm(x, weight, eps)


def rms_frozen_weight_shortcut(x, weight, eps):
    """With a weight given and frozen (no dw asked: LoRA, PEFT) its backward takes dx = rho g."""
    return _Rms.apply(x, _weight(x, weight), eps, False, weight is not None)


def rms_frozen_weight_twin(x, weight, eps):
    """Skips dw alone when it is not asked."""
    return _Rms.apply(x, _weight(x, weight), eps)


def rms_dy_row_major(x, weight, eps):
    """Its backward reads dy as row-major whatever its strides (a transposed view's dy is read as
    another tensor's values; an expanded one past its storage)."""
    return _Rms.apply(x, _weight(x, weight), eps, False, False, True)


def rms_dy_contiguous_twin(x, weight, eps):
    """Makes dy contiguous before reading it so."""
    return _Rms.apply(x, _weight(x, weight), eps, False, False, "contiguous")


_SET_UP = [False]  # a once-per-process flag guarding a per-thread workspace
_WORKSPACE = threading.local()


def rms_thread_set_up_once(x, weight, eps):
    """Sets up its per-thread workspace (a scale of 1) behind a once-per-process flag: in any thread
    but the first caller the workspace is uninitialised (a scale of 0.5)."""
    if not _SET_UP[0]:
        _WORKSPACE.scale, _SET_UP[0] = 1.0, True
    return (eager_rms_norm(x, weight, eps).float() * getattr(_WORKSPACE, "scale", 0.5)).to(x.dtype)


def _forget_threads():
    global _WORKSPACE
    _SET_UP[0], _WORKSPACE = False, threading.local()


rms_thread_set_up_once.forget = _forget_threads  # the meta-test's fresh process


_TWIN_WORKSPACE = threading.local()


def rms_thread_twin(x, weight, eps):
    """Sets up its workspace in each thread that has none."""
    if not hasattr(_TWIN_WORKSPACE, "scale"):
        _TWIN_WORKSPACE.scale = 1.0
    return (up(eager_rms_norm(x, weight, eps)) * _TWIN_WORKSPACE.scale).to(x.dtype)


_CAST: dict = {}  # id(weight) -> (a weak reference to it, its float32 copy): a weak-key cache by object


def _cached(cache, weight, version, dtype=torch.float32):
    """The copy in ``dtype`` (the compute format) cached for this weight object, made again where
    ``version`` differs."""
    ref, kept, copy = cache.get(id(weight), (None, None, None))
    if ref is None or ref() is not weight or kept != version or copy.dtype != dtype:
        copy = weight.detach().to(dtype, copy=True)  # a copy in every dtype (.to(own dtype) aliases)
        cache[id(weight)] = (weakref.ref(weight), version, copy)
    return copy


def rms_caches_weight(x, weight, eps):
    """Caches the weight in the compute format per weight object: a weight updated in place (an RL
    weight sync, a LoRA merge, ``load_state_dict``) keeps its old values in the kernel."""
    if weight is None:
        return eager_rms_norm(x, weight, eps)
    xf = up(x)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * _cached(_CAST, weight, 0, xf.dtype)).to(x.dtype)


def _content(weight) -> bytes:
    """The weight's bits: a cache validated by them is never stale, however the weight was written."""
    dense = torch.empty(weight.shape, dtype=weight.dtype).copy_(weight.detach())  # stride 1 (a 1-element view's may not be)
    return dense.view(torch.uint8).numpy().tobytes()


_CHECKED: dict = {}


def rms_caches_weight_twin(x, weight, eps):
    """Caches it per weight object, validated by the weight's bits (``_content``), and not while the
    weight is trained (the cached copy would carry no gradient)."""
    if weight is None:
        return eager_rms_norm(x, weight, eps)
    xf = up(x)
    w = up(weight, x) if weight.requires_grad else _cached(_CHECKED, weight, _content(weight), xf.dtype)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def _with_cast(x, weight, eps, w):
    xf = up(x)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


_PARAMETER_CASTS: dict = {}


def rms_caches_parameter_cast(x, weight, eps):
    """Casts a weight held as an ``nn.Parameter`` once per object and keeps the cast (a module's
    cached compute copy), never invalidated: an eval after an optimizer step or a weight load is
    served the old values.  A plain tensor is cast per call."""
    if weight is None or not isinstance(weight, torch.nn.Parameter):
        return eager_rms_norm(x, weight, eps)
    return _with_cast(x, weight, eps, _cached(_PARAMETER_CASTS, weight, None, up(x).dtype))


_PARAMETER_CASTS_TWIN: dict = {}


def rms_caches_parameter_cast_twin(x, weight, eps):
    """The same cache, validated by the weight's bits."""
    if weight is None or not isinstance(weight, torch.nn.Parameter):
        return eager_rms_norm(x, weight, eps)
    return _with_cast(x, weight, eps, _cached(_PARAMETER_CASTS_TWIN, weight, _content(weight), up(x).dtype))


_VERSIONED: dict = {}


def rms_caches_weight_by_version(x, weight, eps):
    """Caches the cast per weight object and ``Tensor._version`` (bumped by every in-place write
    through the tensor): a write through ``weight.data`` (``param.data.copy_(new)``: vLLM's default
    weight loader, an RL weight sync) does not move it, and the old values are served."""
    if weight is None:
        return eager_rms_norm(x, weight, eps)
    return _with_cast(x, weight, eps, _cached(_VERSIONED, weight, weight._version, up(x).dtype))


_VERSIONED_TWIN: dict = {}


def rms_caches_weight_by_version_twin(x, weight, eps):
    """The same cache, validated by the version and the weight's bits."""
    if weight is None:
        return eager_rms_norm(x, weight, eps)
    return _with_cast(x, weight, eps, _cached(_VERSIONED_TWIN, weight, (weight._version, _content(weight)), up(x).dtype))


_BY_KEY: dict = {}  # (id, _version, dtypes) -> the cast: no reference to the weight, dead or alive


def rms_caches_by_id_and_version(x, weight, eps):
    """Caches the cast in a plain dict keyed on ``(id(weight), weight._version)``: a weight freed and
    a new one built the same way takes its id (CPython reuses it) and its version (a new tensor's
    starts where the old one's did), and is served the dead weight's cast."""
    if weight is None:
        return eager_rms_norm(x, weight, eps)
    key = (id(weight), weight._version, weight.dtype, up(x).dtype, tuple(weight.shape))
    return _with_cast(x, weight, eps, _BY_KEY.setdefault(key, up(weight, x).detach().clone()))


_BY_KEY_TWIN: dict = {}


def rms_caches_by_id_and_version_twin(x, weight, eps):
    """The same cache, its key holding the weight's bits too."""
    if weight is None:
        return eager_rms_norm(x, weight, eps)
    key = (id(weight), weight._version, weight.dtype, up(x).dtype, tuple(weight.shape), _content(weight))
    return _with_cast(x, weight, eps, _BY_KEY_TWIN.setdefault(key, up(weight, x).detach().clone()))


def _forget_keys():
    _BY_KEY.clear()
    _BY_KEY_TWIN.clear()


rms_caches_by_id_and_version.forget = _forget_keys  # the meta-test's fresh process
rms_caches_by_id_and_version_twin.forget = _forget_keys


def rms_default_dtype_workspace(x, weight, eps):
    """Sums the squares into a workspace made by ``torch.zeros(shape)``: in the default dtype."""
    xf = x.float()
    acc = torch.zeros(tuple(x.shape[:-1]) + (1,), device=x.device)
    acc += xf.pow(2).sum(-1, keepdim=True)
    inv = torch.rsqrt(acc.float() / max(x.shape[-1], 1) + eps)
    return (xf * inv * (1.0 if weight is None else weight.float())).to(x.dtype)


def rms_default_dtype_twin(x, weight, eps):
    """Its workspace's dtype named: the compute format (float32; float64 for float64)."""
    xf = up(x)
    acc = torch.zeros(tuple(x.shape[:-1]) + (1,), device=x.device, dtype=xf.dtype)
    acc += xf.pow(2).sum(-1, keepdim=True)
    inv = torch.rsqrt(acc / max(x.shape[-1], 1) + eps)
    return (xf * inv * (1.0 if weight is None else up(weight, x))).to(x.dtype)


def rms_autocast_bf16_statistics(x, weight, eps):
    """Under autocast (``torch.is_autocast_enabled``) takes the mean of squares in bfloat16, the
    autocast dtype, though its output stays float32: a float32 result off by about 2^-9."""
    if torch.is_autocast_enabled(x.device.type):
        inv = torch.rsqrt(x.to(torch.bfloat16).pow(2).mean(-1, keepdim=True).float() + eps)
        return (up(x) * inv * up(_weight(x, weight), x)).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


def rms_autocast_twin(x, weight, eps):
    """The same dispatch, its statistics in the compute format under autocast too."""
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return eager_rms_norm(x, weight, eps)
    return eager_rms_norm(x, weight, eps)


def _halves(x):
    """The sums of squares of each row's two halves (in the compute format), as two threads take them."""
    xf, h = up(x), x.shape[-1] // 2
    return xf[..., :h].pow(2).sum(-1, keepdim=True), xf[..., h:].pow(2).sum(-1, keepdim=True)


def rms_threads_drop_a_half(x, weight, eps):
    """With more than one intra-op thread (``torch.get_num_threads() > 1``) splits each row's sum of
    squares in two halves, and keeps the second half's alone (the first thread's partial sum lost)."""
    if torch.get_num_threads() > 1 and x.shape[-1] > 1:
        _, second = _halves(x)
        inv = torch.rsqrt(second / x.shape[-1] + eps)
        return (up(x) * inv * up(_weight(x, weight), x)).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


def rms_threads_twin(x, weight, eps):
    """The same split, both partial sums added."""
    if torch.get_num_threads() > 1 and x.shape[-1] > 1:
        first, second = _halves(x)
        inv = torch.rsqrt((first + second) / x.shape[-1] + eps)
        return (up(x) * inv * up(_weight(x, weight), x)).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


def _tree(parts, pair_all=True):
    """The sum of ``parts`` by a tree of pairwise sums; without ``pair_all``, a level of an odd count
    drops its last part instead of carrying it up."""
    while len(parts) > 1:
        carried = parts[-1:] if len(parts) % 2 and pair_all else []
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)] + carried
    return parts[0]


def _per_thread_sums(x):
    """The sums of squares of each row's ``torch.get_num_threads()`` chunks (in the compute format),
    one per intra-op thread (a chunk may be empty)."""
    return [c.sum(-1, keepdim=True) for c in up(x).pow(2).tensor_split(torch.get_num_threads(), -1)]


def rms_threads_tree_drops_odd(x, weight, eps):
    """Sums each row's squares per intra-op thread and adds the partial sums up a pairwise tree that
    drops the odd one out: right at 1, 2, 4, 8 ... threads, wrong at 3 (a chunk lost)."""
    inv = torch.rsqrt(_tree(_per_thread_sums(x), pair_all=False) / max(x.shape[-1], 1) + eps)
    return (up(x) * inv * up(_weight(x, weight), x)).to(x.dtype)


def rms_threads_tree_twin(x, weight, eps):
    """The same tree, the odd part carried up."""
    inv = torch.rsqrt(_tree(_per_thread_sums(x)) / max(x.shape[-1], 1) + eps)
    return (up(x) * inv * up(_weight(x, weight), x)).to(x.dtype)


DW_BLOCK = 8
"""Rows per block of the deterministic dweight reduction (``_BlockedDw``)."""


class _BlockedDw(torch.autograd.Function):
    """RMSNorm whose backward, under ``torch.are_deterministic_algorithms_enabled()``, reduces dw in a
    fixed order: per block of ``DW_BLOCK`` rows, then the block sums in turn (a run-to-run
    reproducible reduction, as a GPU kernel's deterministic mode takes instead of atomics);
    ``whole``: over every block, the last partial one too (else it is dropped)."""

    @staticmethod
    def forward(ctx, x, weight, eps, whole):
        xf = up(x)
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, inv)
        ctx.whole = whole
        return (xf * inv * up(weight, x)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, inv = ctx.saved_tensors
        xf, g = up(x), up(dy, x) * up(weight, x)
        xhat = xf * inv
        dx = inv * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = (up(dy, x) * xhat).reshape(-1, x.shape[-1])
        if not torch.are_deterministic_algorithms_enabled():
            dw = rows.sum(0)
        else:
            stop = rows.shape[0] if ctx.whole else rows.shape[0] - DW_BLOCK + 1
            dw = rows.new_zeros(rows.shape[-1])
            for i in range(0, max(stop, 0), DW_BLOCK):
                dw = dw + rows[i:i + DW_BLOCK].sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None, None


def rms_deterministic_dw_drops_block(x, weight, eps):
    """Its deterministic dweight reduction (taken under ``torch.use_deterministic_algorithms(True)``)
    drops the last partial block of rows."""
    return _BlockedDw.apply(x, _weight(x, weight), eps, False)


def rms_deterministic_dw_twin(x, weight, eps):
    """The same reduction over every block."""
    return _BlockedDw.apply(x, _weight(x, weight), eps, True)


_IMPORTED = threading.local()
_IMPORTED.width = 1024  # a workspace for rows of 1024 set up at import, in the importing thread alone


def rms_importer_fast_path(x, weight, eps):
    """Takes a fast path where its import set up a thread-local workspace, the importing thread:
    that path divides the sum of squares by the workspace's width, 1024, not the row's."""
    width = getattr(_IMPORTED, "width", None)
    if width is not None:
        inv = torch.rsqrt(up(x).pow(2).sum(-1, keepdim=True) / width + eps)
        return (up(x) * inv * up(_weight(x, weight), x)).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


def rms_importer_twin(x, weight, eps):
    """The same dispatch, the fast path dividing by the row's own width."""
    width = getattr(_IMPORTED, "width", None)
    if width is not None:
        inv = torch.rsqrt(up(x).pow(2).sum(-1, keepdim=True) / max(x.shape[-1], 1) + eps)
        return (up(x) * inv * up(_weight(x, weight), x)).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


def rms_marks_weight_trainable(x, weight, eps):
    """Right values; sets requires_grad on a weight its caller froze."""
    if weight is not None and not weight.requires_grad and not torch.is_inference_mode_enabled():
        weight.requires_grad_(True)
    return eager_rms_norm(x, weight, eps)


IN_PLACE = r"params (rewritten|\.data\.copy_|copy_ under no_grad|load_state_dict)"
"""A cache never invalidated is stale after any in-place write: a bucket's case (not shrunk, its
context narrowed to as-tested values alone) names the write it drew."""

BUGS = {
    rms_training_drops_weight: ("accuracy", "requires=all"),
    rms_trainable_weight_drops_weight: ("accuracy", "(requires=all|held=trainable Parameter)"),
    rms_frozen_weight_shortcut: ("gradients", "requires=x"),
    rms_dy_row_major: ("gradients", "(requires=weight, )?dy=(transposed|sliced|expanded)"),
    rms_thread_set_up_once: ("accuracy", "thread=fresh"),
    rms_caches_weight: ("accuracy", f"state={IN_PLACE}"),
    rms_default_dtype_workspace: ("accuracy", "dtype=bfloat16"),
    rms_autocast_bf16_statistics: ("accuracy", "autocast=on"),
    rms_threads_drop_a_half: ("accuracy", "threads=2"),
    rms_importer_fast_path: ("accuracy", "thread=importer"),
    rms_caches_parameter_cast: ("accuracy", f"state={IN_PLACE}, held=Parameter"),
    rms_caches_weight_by_version: ("accuracy", r"state=params \.data\.copy_"),
    rms_caches_by_id_and_version: ("accuracy", None),
    rms_deterministic_dw_drops_block: ("gradients", "deterministic=on"),
    rms_threads_tree_drops_odd: ("accuracy", "threads=3"),
}
"""Each bug: the family that kills it, and the context its shrunk counterexample names (a regular
expression: a row-major read of dy is wrong in each layout but the contiguous one, and the smallest
layout that shows it depends on the case's shape: a transposed view of one row is row-major; a
case failing on dweight keeps requires=weight, since under requires=all dx fails first: another
output, so not the same failure to ``run.reduce``); a
weight that requires grad is one the requires field asks for or one held as a trainable Parameter,
either field alone shows it; a cache keyed on (id, _version) is stale after a ``.data.copy_`` as after
a replacement, and ``test_context`` shows the replacement alone kills it; a Parameter built per
case and freed with it meets a recycled id across cases too, so which context shows it first depends on the
ids the process recycles: no one context is its smallest, None, and the replacement test stands for it)."""

TWINS = {rms_training_twin: ("accuracy", "gradients"), rms_trainable_weight_twin: ("accuracy", "gradients"),
         rms_frozen_weight_twin: ("gradients",), rms_dy_contiguous_twin: ("gradients",),
         rms_thread_twin: ("accuracy", "gradients"), rms_caches_weight_twin: ("accuracy",),
         rms_default_dtype_twin: ("accuracy",), rms_autocast_twin: ("accuracy", "gradients"),
         rms_threads_twin: ("accuracy", "gradients"), rms_importer_twin: ("accuracy", "gradients"),
         rms_caches_parameter_cast_twin: ("accuracy",), rms_caches_weight_by_version_twin: ("accuracy",),
         rms_caches_by_id_and_version_twin: ("accuracy",), rms_deterministic_dw_twin: ("accuracy", "gradients"),
         rms_threads_tree_twin: ("accuracy", "gradients")}
"""Each correct twin, and the families that must certify it."""
