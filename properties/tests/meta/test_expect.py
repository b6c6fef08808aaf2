"""A planted kernel's expectation (``expect``) is checked where it is declared."""
from __future__ import annotations

import types

import pytest

from .expect import bug, catalogue, correct


def test_a_misspelt_op_or_family_fails_at_the_decorator():
    with pytest.raises(ValueError, match="@bug: op must be one of rms_norm, .*got 'rmsnorm'"):
        bug("rmsnorm", "accuracy")
    with pytest.raises(ValueError, match=r"@bug\('rms_norm'\): families must be some of accuracy, .*got acuracy"):
        bug("rms_norm", "acuracy")
    with pytest.raises(ValueError, match=r"@bug\('rms_norm'\): families must be some of .*got none"):
        bug("rms_norm")
    with pytest.raises(ValueError, match=r"@correct\('rms_norm'\): families must be none of .*got accuracy"):
        correct("rms_norm", "accuracy")


def test_a_catalogue_lists_a_module_s_kernels_of_one_role_in_order():
    module = types.ModuleType("planted_here")

    @bug("layer_norm", "accuracy", "extremes")
    def second(x, weight, bias, eps):
        return x

    @correct("rms_norm")
    def right(x, weight, eps):
        return x

    @bug("rms_norm", "gradients")
    def first(x, weight, eps):
        return x

    module.first, module.right, module.second = first, right, second
    assert catalogue(module, "bug") == [("rms_norm", first, {"gradients"}),
                                        ("layer_norm", second, {"accuracy", "extremes"})]
    assert catalogue(module, "correct") == [("rms_norm", right, set())]
    with pytest.raises(ValueError, match="role must be one of bug, bucket_bug, batch_size_bug, correct"):
        catalogue(module, "bugs")
