"""A planted kernel's expectation (``expect``) is checked where it is declared, and every planted
kernel is in the catalogue the meta-tests read (the ``planted`` package's namespace)."""
from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

from ...run.plugin import PLANTED, PLANTED_MODULES, REPLAYABLE
from . import planted
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


def test_every_planted_kernel_is_in_the_package_and_replayable():
    """Each module of the planted package exports every kernel it defines (its ``__all__``), the
    package re-exports each under its own name (a kernel left out would be in no catalogue, nor
    reachable as ``planted:NAME``), no two modules export one name, and the plugin names every
    module (``PLANTED_MODULES``: a replay file may name a kernel by the module that defines it)."""
    assert planted.__name__ == PLANTED
    names = sorted(m.name for m in pkgutil.iter_modules(planted.__path__) if not m.name.startswith("_"))
    assert sorted(PLANTED_MODULES) == names
    exported = []
    for name in PLANTED_MODULES:
        module = importlib.import_module(f"{PLANTED}.{name}")
        assert module.__name__ in REPLAYABLE
        defined = [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                   and (getattr(v, "__module__", None) == module.__name__ or hasattr(v, "normcert_planted"))]
        assert not set(defined) - set(module.__all__), f"{name}: not in __all__: {set(defined) - set(module.__all__)}"
        assert [n for n in module.__all__ if getattr(planted, n) is not getattr(module, n)] == []
        exported += module.__all__
    assert sorted(exported) == sorted(set(exported)) == sorted(planted.__all__)
