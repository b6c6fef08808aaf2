"""Kernels with planted bugs the suite must reject, and correct variants it must certify.

Each bug is a small, plausible mistake (the kind seen in real kernels).  The catalogue is kept by
op family, one module each, an op's bugs beside its correct variants:

    rms_norms         rms_norm, add_rms_norm, gemma_rms_norm; rms_norm with no autograd, as
                      inference libraries ship it
    shapes            bugs that show at some shapes only: with the batch size, in one scheduled
                      bucket (``buckets.buckets``), past 2**31 elements (2**16 here)
    gated_norm        rms_norm_gated
    norm_quant        rms_norm quantised to fp8 or int8: rms_norm_dynamic_quant, rms_norm_group_quant,
                      rms_norm_fp8, and their add_ forms
    fp4               rms_norm_fp4_quant, add_rms_norm_fp4_quant, silu_and_mul_fp4_quant
    fp4_rules         FP4 kernels correct under a declared block-scale rule (mx_scale, block_floor, nan)
    activation_quant  silu_and_mul_dynamic_quant, silu_and_mul_group_quant, silu_and_mul_group_quant_masked
    layer_norms       layer_norm, add_layer_norm, deep_norm
    batch_norm        batch_norm
    activations       swiglu, silu_and_mul, geglu, gelu_and_mul
    conventions       kernels that write into caller buffers (MODULE:ATTR@inplace / @out / @outkw)
    _helpers          private helpers that more than one of them uses

Each planted kernel says what the meta-tests expect of it on its own decorator (``expect``:
``@bug``, ``@bucket_bug``, ``@batch_size_bug``, ``@correct``); ``test_meta.py`` reads the
catalogues with ``expect.catalogue(planted, role)``, which lists this package's namespace.  Each
module's ``__all__`` is re-exported here, so that every kernel is in the catalogues and is named
``normcert.properties.tests.meta.planted:NAME`` (as the docs, replay files and ``--impl`` name it)
whichever module holds it.  A kernel left out of its module's ``__all__`` would be in no catalogue
(``test_expect`` checks that none is).  A new module is imported below, in the catalogue's order,
and named in ``properties.run.plugin.PLANTED_MODULES``: the modules a replay file may name.
"""
from __future__ import annotations

from . import (activation_quant, activations, batch_norm, conventions, fp4, fp4_rules, gated_norm, layer_norms,
               norm_quant, rms_norms, shapes)
from .rms_norms import *  # noqa: F403
from .shapes import *  # noqa: F403
from .gated_norm import *  # noqa: F403
from .norm_quant import *  # noqa: F403
from .fp4 import *  # noqa: F403
from .fp4_rules import *  # noqa: F403
from .activation_quant import *  # noqa: F403
from .layer_norms import *  # noqa: F403
from .batch_norm import *  # noqa: F403
from .activations import *  # noqa: F403
from .conventions import *  # noqa: F403

__all__ = [*rms_norms.__all__, *shapes.__all__, *gated_norm.__all__, *norm_quant.__all__, *fp4.__all__,
           *fp4_rules.__all__, *activation_quant.__all__, *layer_norms.__all__, *batch_norm.__all__,
           *activations.__all__, *conventions.__all__]
