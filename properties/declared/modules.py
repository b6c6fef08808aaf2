"""Modules as kernels: ``OP=MODULE:ATTR`` where ATTR is an ``nn.Module`` class or instance.

Users import norms as modules holding their weight: ``nn.RMSNorm``, ``nn.LayerNorm``, transformers'
``LlamaRMSNorm``, Liger's ``LigerRMSNorm(hidden, casting_mode=..., in_place=...)``.  For an op whose
contract is ``y = f(x, weight[, bias], eps)`` (``MODULE_OPS``), ``adapt`` makes such a module that
contract's function:

    f(x, weight[, bias], eps) = functional_call(m, {"weight": weight[, "bias": bias]}, (x,))

where m is, for a class C, ``C(n, eps=eps)`` (n = x's last dim: the module's width); for an
instance M, a copy of M (``copy.deepcopy``, made once per (n, eps)) with its epsilon attribute
(``eps`` or ``variance_epsilon``, whichever it has) set to eps and a ``normalized_shape`` it holds
set to (n,): the instance keeps every other choice it was built with (a casting mode, an offset,
in-place backwards).  ``torch.func.functional_call`` puts the case's own weight and bias in the
module's parameters for the call, so gradients reach them as a model's training step would.  A
module without a ``weight`` parameter (or, for an op with a bias, a ``bias`` one), or without an
epsilon normcert can set, is refused when it is registered (``ModuleError``, one line).  Modules
are built on first use of a (width, eps) and the latest ``MODULES_KEPT`` kept (a cache per
kernel: its own state, not shared between kernels).

A weight given as None (a weightless call) is passed as ``None`` for the parameter; a module that
cannot take it raises, and normcert then gives ones, saying so (``probes.accepts_weightless``).
"""
from __future__ import annotations

import copy
import functools
import inspect

import torch

MODULE_OPS = ("rms_norm", "gemma_rms_norm", "layer_norm")
"""The ops a module can stand for: ``y = module(x)`` with the op's weight (and bias) its parameters."""

MODULES_KEPT = 64
"""The modules a kernel keeps built, the latest used (each case draws its width and eps)."""

EPS_NAMES = ("eps", "variance_epsilon")
"""The attribute names an instance's epsilon is read and set by (torch's, transformers' and Liger's)."""


class ModuleError(ValueError):
    """A module normcert cannot call as the op's kernel; one line naming what it lacks."""


def is_module(obj) -> bool:
    """Is ``obj`` an ``nn.Module`` class or instance?"""
    return isinstance(obj, torch.nn.Module) or (inspect.isclass(obj) and issubclass(obj, torch.nn.Module))


def adapt(obj, rec, target: str):
    """The contract function of module class or instance ``obj`` for op record ``rec`` (module
    docstring); ModuleError where it cannot be one.  Its ``normcert_domain`` is the module's."""
    if rec.name not in MODULE_OPS:
        raise ModuleError(f"{target} is an nn.Module: a module can stand for {', '.join(MODULE_OPS)} "
                          f"(y = module(x)), not {rec.name}")
    params = ("weight", "bias") if "bias" in [a.name for a in rec.args] else ("weight",)

    @functools.lru_cache(maxsize=MODULES_KEPT)
    def module(n: int, eps: float):
        return _built(obj, n, eps, target)

    _check(module(8, 1e-6), params, target)  # what it lacks, said at registration

    def kernel(x, *args):
        *given, eps = args
        m = module(x.shape[-1], float(eps))
        return torch.func.functional_call(m, dict(zip(params, given)), (x,), strict=False)

    functools.update_wrapper(kernel, obj if inspect.isclass(obj) else type(obj), assigned=("__module__", "__name__",
                                                                                          "__qualname__", "__doc__"))
    kernel.__signature__ = inspect.Signature([inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                              for a in rec.args])
    domain = getattr(obj, "normcert_domain", None)
    if domain is not None:
        kernel.normcert_domain = domain
    return kernel


def _built(obj, n: int, eps: float, target: str) -> torch.nn.Module:
    """A module of width ``n`` and epsilon ``eps`` (module docstring)."""
    if inspect.isclass(obj):
        try:
            return obj(n, eps=eps)
        except TypeError as e:
            raise ModuleError(f"{target}: the class is built as {obj.__name__}(n, eps=eps), which raised "
                              f"TypeError: {e}") from None
    m = copy.deepcopy(obj)
    names = [k for k in EPS_NAMES if isinstance(getattr(m, k, None), (int, float))]
    if not names:
        raise ModuleError(f"{target}: the instance holds no epsilon normcert can set (an attribute "
                          f"{' or '.join(EPS_NAMES)} holding a number)")
    for k in names:
        setattr(m, k, eps)
    if isinstance(getattr(m, "normalized_shape", None), (tuple, list)):
        m.normalized_shape = (n,)
    return m


def _check(m: torch.nn.Module, params: tuple[str, ...], target: str) -> None:
    own = dict(m.named_parameters(recurse=False))
    lacking = [p for p in params if p not in own]
    if lacking:
        raise ModuleError(f"{target}: the module holds no parameter {' or '.join(map(repr, lacking))} "
                          f"(its parameters: {', '.join(own) or 'none'}); normcert sets the case's "
                          f"{' and '.join(params)} there")
