"""The exported reproducer (``evidence.reproducer``) applies the context fields of parameters and
switches: a failure that needs the parameters held as ``nn.Parameter``, written back by a loader's
path (``.data.copy_``, ``copy_`` under no_grad, ``load_state_dict``) or replaced by a new weight with
the dead one's id, or deterministic algorithms on, fails in the script as in normcert (exit 1, the
context named), and the fixed kernel passes there (exit 0).

The script is run in this process (``runpy``): its ``main`` is what ``python repro.py`` runs, with
torch already imported; ``test_reproducer`` runs scripts where normcert cannot be imported.
"""
from __future__ import annotations

import runpy
import shlex

import pytest
import torch

from ..evidence import reproducer
from ..evidence.replay import save_failure
from ..families import BY_NAME
from ..harness.measure import PropertyFailure, Worst
from ..harness.session import Session
from ..search.case import Case
from ..search.context import Context
from ... import impls
from ...impls.eager import rms_norm as eager_rms_norm
from .meta import planted_context

F32 = torch.float32
PLANTED = "normcert.properties.tests.meta.planted_context"
HERE = "normcert.properties.tests.test_reproducer_params"


def rms_halved_when_deterministic(x, weight, eps):
    """Right, but halved under ``torch.use_deterministic_algorithms(True)`` (a forward path of its own)."""
    y = eager_rms_norm(x, weight, eps)
    return y / 2 if torch.are_deterministic_algorithms_enabled() else y


CASES = [(f"{PLANTED}:rms_caches_weight_by_version", f"{PLANTED}:rms_caches_weight_by_version_twin",
          Context(state="params .data.copy_")),
         (f"{PLANTED}:rms_caches_by_id_and_version", f"{PLANTED}:rms_caches_by_id_and_version_twin",
          Context(state="params replaced")),
         (f"{PLANTED}:rms_caches_parameter_cast", f"{PLANTED}:rms_caches_parameter_cast_twin",
          Context(state="params load_state_dict", held="Parameter")),
         (f"{PLANTED}:rms_caches_parameter_cast", f"{PLANTED}:rms_caches_parameter_cast_twin",
          Context(state="params copy_ under no_grad", held="trainable Parameter")),
         (f"{HERE}:rms_halved_when_deterministic", "normcert.impls.eager:rms_norm", Context(deterministic="on"))]


@pytest.mark.parametrize("target, fixed, context", CASES, ids=[c.describe() for _, _, c in CASES])
def test_the_reproducer_holds_writes_and_switches_as_the_context_did(tmp_path, capsys, target, fixed, context):
    impl = impls.plugin(f"rms_norm={target}")
    getattr(impl.fn, "forget", lambda: None)()
    case = Case.sample("rms_norm", F32)
    case.context = context
    with pytest.raises(PropertyFailure, match=f"in context {context.describe()}: "):
        BY_NAME["accuracy"].check(Session(failures_dir=str(tmp_path)), impl, case, Worst())
    replay = shlex.split(save_failure(impl, "accuracy", case, str(tmp_path)))[-1]
    for spec, status in ((f"rms_norm={target}", 1), (f"rms_norm={fixed}", 0)):
        script = tmp_path / "repro.py"
        reproducer.export(replay, str(script), [spec])
        script_main = runpy.run_path(str(script), run_name="repro")["main"]
        assert script_main() == status
        line = capsys.readouterr().out.strip()
        assert line.startswith(f"accuracy still fails for rms_norm:{target}: in context {context.describe()}: y[")\
            if status else line.startswith(f"accuracy holds for rms_norm:{fixed} on the "), line
    assert not torch.are_deterministic_algorithms_enabled()
