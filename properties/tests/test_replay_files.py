"""Replay files: exact round trip, clear errors on bad files, and the replay command end to end.

* a saved case loads back bit for bit: dtype, shape, strides (a transposed
  bfloat16 view, a bool mask, sublayer weights), the scalars and a backward's dy;
* a file that is not a replay file, is truncated, or names an unknown op is a
  ``ReplayError`` naming the file and what is wrong (never unpickled); so is every hostile
  variant of a good file: JSON nested 100 000 deep, eps = 10**400, a null x, a weight of the
  wrong shape or dtype, a 0-d x, empty shapes of 2**62 or 2**40 rows, a property that does not
  apply or lacks its params, two members of one name;
* a property's own draws (invariance's transform, the mask properties' fill and row) round trip
  and are checked against their kind;
* ``normcert replay FILE`` of a planted bug's failure exits 1 with no
  Hypothesis database, and ``pytest --pyargs normcert.properties.suite --replay FILE``
  exits 0 against a correct kernel given with ``--impl``, both from any folder.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from ...impls import plugin
from ..search.buckets import LONG_RUN_CALLS
from ..search.case import Case
from ..evidence import files
from ..evidence.replay import ReplayError, load, save_failure
from .replay_helpers import restamped, rewrite



def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4
                               else torch.int64 if t.element_size() == 8 else torch.uint8)


def _deep_norm_case():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, generator=g).to(torch.bfloat16).t()  # (3, 5), strides (1, 3)
    n = x.shape[-1]
    t = {"x": x, "sub_weight": torch.randn(n, n, generator=g).to(torch.bfloat16),
         "sub_bias": torch.zeros(n, dtype=torch.bfloat16), "weight": torch.ones(n, dtype=torch.float32),
         "bias": torch.tensor([float("nan"), 0, -0.0, float("inf"), 1e-40], dtype=torch.float32)}
    dy = torch.randn(3, 5, generator=g).to(torch.bfloat16)  # the backward's dy it failed on (``Case.cotangents``)
    return Case("deep_norm", t, {"eps": 1e-6, "alpha": 1.5}, {"x": "test"}, {"cot_seed": 7}, cotangents={"y": dy})


def test_round_trip_is_bit_exact(tmp_path):
    case = _deep_norm_case()
    impl = plugin("deep_norm=normcert.impls.eager:deep_norm")
    cmd = save_failure(impl, "gradients", case, directory=str(tmp_path))
    meta, back = load(shlex.split(cmd)[-1], "cpu")
    assert meta["impl"] == "deep_norm=normcert.impls.eager:deep_norm" and meta["property"] == "gradients"
    assert back.scalars == case.scalars and back.params == case.params
    for k, t in [*case.tensors.items(), *case.cotangents.items()]:
        u = back.tensors[k] if k in back.tensors else back.cotangents[k]
        assert (u.dtype, u.shape, u.stride()) == (t.dtype, t.shape, t.stride()), k
        assert torch.equal(_bits(u), _bits(t)), k


def test_mask_round_trip(tmp_path):
    x = torch.randn(2, 3, 4)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    case = Case("batch_norm", {"x": x, "weight": torch.ones(4), "bias": torch.zeros(4), "mask": mask}, {"eps": 1e-5},
                params={"fill": "nan", "fill_seed": 5})
    cmd = save_failure(plugin("batch_norm=normcert.impls.eager:batch_norm"), "padding", case, directory=str(tmp_path))
    _, back = load(shlex.split(cmd)[-1], "cpu")
    assert back.tensors["mask"].dtype == torch.bool and torch.equal(back.tensors["mask"], mask)


def test_gelu_form_round_trip_and_refusal(tmp_path):
    """GELU's form is a string scalar: it comes back as written, and any other name is refused."""
    case = Case("gelu_and_mul", {"x": torch.randn(2, 6)}, {"approximate": "tanh"})
    cmd = save_failure(plugin("gelu_and_mul=normcert.impls.eager:gelu_and_mul"), "accuracy", case,
                       directory=str(tmp_path))
    path = shlex.split(cmd)[-1]
    _, back = load(path, "cpu")
    assert back.scalars == {"approximate": "tanh"}
    rewrite(path, _set("scalars.approximate", "erf"))
    with pytest.raises(ReplayError, match="approximate must be one of 'none', 'tanh', got 'erf'"):
        load(path, "cpu")
    rewrite(path, _set("scalars", {}))
    with pytest.raises(ReplayError, match=r"scalars \[\], expected \['approximate'\]"):
        load(path, "cpu")


def _saved(tmp_path):
    cmd = save_failure(plugin("deep_norm=normcert.impls.eager:deep_norm"), "gradients", _deep_norm_case(),
                       directory=str(tmp_path))
    return shlex.split(cmd)[-1]


def test_a_file_that_is_not_the_failure_its_name_says_is_refused(tmp_path):
    """A row (and a replay command) names its file by a name that holds the failure's cell and its bytes'
    hash: a file replaced after the run, or renamed to another cell's name, is refused in one line."""
    path = _saved(tmp_path)
    load(path, "cpu")
    rewrite(path, _set("notes", {"replaced": "after the run"}))
    with pytest.raises(ReplayError, match="not the failure its name says: its bytes are not those it was saved with"):
        load(path, "cpu")
    path = restamped(path)
    load(path, "cpu")
    elsewhere = path.replace("-gradients-", "-accuracy-")
    os.replace(path, elsewhere)
    with pytest.raises(ReplayError) as e:
        load(elsewhere, "cpu")
    assert "not the failure its name says: its name is the cell deep_norm-" in str(e.value)
    assert "-accuracy-bfloat16" in str(e.value) and "not one of deep_norm gradients" in str(e.value)


def _set(field, value):
    def change(meta):
        target = meta
        *keys, last = field.split(".")
        for k in keys:
            target = target[k]
        target[last] = value
    return change


def _set_x_shape(shape):
    def change(meta):
        meta["tensors"]["x"].update(shape=shape, stride=[1] * len(shape))
    return change


@pytest.mark.parametrize("change, says", [
    (_set("tensors.x.stride", [0, 0]), None),  # filled in below: a huge shape over one element
    (_set("tensors.x.stride", [-4, 1]), "negative strides are not replayable"),
    (_set("tensors.x.dtype", "float8"), "dtype 'float8'"),
    (_set("scalars.eps", 0.0), "eps must be a positive finite float, got 0.0"),
    (_set("property", "speed"), "unknown property 'speed'"),
    (_set("tensors.extra", None), "expected ['bias', 'sub_bias', 'sub_weight', 'weight', 'x']"),
    (_set("scalars.eps", 10 ** 400), "eps must be a positive finite float, got 1000000000000000000000000000000000000..."),
    (_set("tensors.x", None), "tensor 'x' is null, and deep_norm needs it"),
    (_set("tensors.weight.shape", [4]), "deep_norm: weight must be of shape (5,) (the last dim of x), got (4,)"),
    (_set("tensors.weight.dtype", "float16"), "deep_norm: weight must be of dtype"),
    (_set_x_shape([]), "x must be a tensor of rank >= 1, got rank 0"),
    (_set_x_shape([0, 2 ** 62]), "declares 4611686018427387904 elements"),
    (_set_x_shape([2 ** 40, 0]), "declares 1099511627776 elements"),
    (_set("property", "padding"), "property 'padding' does not apply to deep_norm"),
    (_set("params", {}), "params [], expected ['cot_seed'] for property 'gradients'"),
    (_set("cotangents.y.shape", [3, 4]), "cotangent 'y' has shape (3, 4), expected (3, 5) (the output's)"),
    (_set("cotangents", {"z": None}), "'cotangents' must hold a float tensor for each output of deep_norm (y)"),
    (_set("cotangents.y.dtype", "bool"), "'cotangents' must hold a float tensor for each output of deep_norm (y)"),
    (_set("params.cot_seed", -1), "param 'cot_seed' = -1: expected an integer in [0, 4294967295]"),
    (_set("params.cot_seed", 10 ** 400), "param 'cot_seed' = 1000000000000000000000000000000000000...: expected a "
                                         "finite number"),
])
def test_hostile_metadata_is_refused_before_anything_is_built(tmp_path, change, says):
    path = _saved(tmp_path)
    if says is None:
        def change(meta):  # noqa: F811 - 10^12 elements declared over one stored element
            meta["tensors"]["x"].update(shape=[10 ** 6, 10 ** 6], stride=[0, 0])
        says = "declares 1000000000000 elements"
    rewrite(path, change)
    with pytest.raises(ReplayError) as e:
        load(path, "cpu")
    assert str(e.value).startswith(path) and says in str(e.value) and "\n" not in str(e.value)


def test_metadata_nested_too_deeply_is_one_line(tmp_path):
    path = _saved(tmp_path)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["meta"] = np.frombuffer(("[" * 100_000 + "]" * 100_000).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(ReplayError, match="metadata nested too deeply"):
        load(path, "cpu")


def test_metadata_nested_below_the_recursion_limit_is_refused_too(tmp_path):
    """Deep enough to be parsed (within Python's recursion limit), too deep for anything normcert writes:
    refused before a check or a page walks it."""
    path = _saved(tmp_path)
    rewrite(path, lambda meta: meta["notes"].update(deep=json.loads("[" * 500 + "]" * 500)))
    with pytest.raises(ReplayError, match="metadata nested too deeply"):
        load(path, "cpu")


def test_a_replay_file_is_saved_under_the_rule_of_every_file_normcert_writes(tmp_path):
    """Its name is content-hashed, yet somebody else's file at that name is not replaced
    (``files.why_not_writable``), and normcert's own file there is (the same failure saved twice)."""
    path = _saved(tmp_path)
    assert not files.foreign(path, "replay")
    assert shlex.split(save_failure(plugin("deep_norm=normcert.impls.eager:deep_norm"), "gradients",
                                    _deep_norm_case(), directory=str(tmp_path)))[-1] == path
    with open(path, "w") as f:
        f.write("my notes\n")
    said = save_failure(plugin("deep_norm=normcert.impls.eager:deep_norm"), "gradients", _deep_norm_case(),
                        directory=str(tmp_path))
    assert said == f"not saved: {path} exists and is not a normcert replay file: normcert replaces only files it " \
                   f"wrote; choose another path"
    assert open(path).read() == "my notes\n"


def test_two_members_of_one_name_are_refused(tmp_path):
    """``t_x`` beside ``t_x.npy``: the size check would read one and np.load the other."""
    path = _saved(tmp_path)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("t_x", b"\0" * 64)
    with pytest.raises(ReplayError, match="two members with one name"):
        load(path, "cpu")


@pytest.mark.parametrize("prop, params, says", [
    ("invariance", {"transform": "scale", "c": 2.0, "d": -0.5}, None),
    ("invariance", {"transform": "shift", "c": 2.0, "d": -0.5}, "expected one of 'scale' for rms_norm"),
    ("invariance", {"transform": "scale", "c": 3.0, "d": -0.5}, "expected 2**k for an integer k in [-6, 6]"),
    ("row-independence", {"row": 1, "fill": "posinf", "fill_seed": 3}, None),
    ("row-independence", {"row": 2, "fill": "posinf", "fill_seed": 3}, "param 'row' = 2: expected an integer in [0, 1]"),
    ("row-independence", {"row": 1, "fill": "lava", "fill_seed": 3}, "expected one of 'nan', 'posinf'"),
    ("batch-invariance", {"shift": 1}, None),
    ("served", {"cot_seed": 3, "calls": LONG_RUN_CALLS}, None),  # the longest run a certify makes
    ("served", {"cot_seed": 3, "calls": LONG_RUN_CALLS + 1},  # one past it: a replay of 2**62 calls runs for ever
     f"param 'calls' = {LONG_RUN_CALLS + 1}: expected an integer in [1, {LONG_RUN_CALLS}]"),
    ("served", {"cot_seed": 3, "calls": 2 ** 62}, f"expected an integer in [1, {LONG_RUN_CALLS}]"),
])
def test_a_property_s_own_draws_round_trip_and_are_checked(tmp_path, prop, params, says):
    """Invariance's transform and the mask properties' fill are names, not numbers: a failing case of
    theirs replays; a param outside its kind is refused in one line."""
    case = Case("rms_norm", {"x": torch.randn(2, 4), "weight": torch.ones(4)}, {"eps": 1e-5}, {}, params)
    path = shlex.split(save_failure(plugin("rms_norm=normcert.impls.eager:rms_norm"), prop, case,
                                    directory=str(tmp_path)))[-1]
    if says is None:
        assert load(path, "cpu")[1].params == params
        return
    with pytest.raises(ReplayError) as e:
        load(path, "cpu")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_served_file_from_before_the_long_run_replays_as_one_call_per_mode(tmp_path):
    """A served file written before ``calls`` existed has none: it replays as it was checked (calls=1,
    ``families.Param.default``); a count below 1 is refused in one line."""
    def saved(params):
        case = Case("rms_norm", {"x": torch.randn(2, 4), "weight": torch.ones(4)}, {"eps": 1e-5}, {}, params)
        return shlex.split(save_failure(plugin("rms_norm=normcert.impls.eager:rms_norm"), "served", case,
                                        directory=str(tmp_path)))[-1]
    assert load(saved({"cot_seed": 3}), "cpu")[1].params == {"cot_seed": 3, "calls": 1}
    with pytest.raises(ReplayError, match=r"param 'calls' = 0: expected an integer in \[1, ") as e:
        load(saved({"cot_seed": 3, "calls": 0}), "cpu")
    assert "\n" not in str(e.value)


def test_a_zip_bomb_member_is_refused_before_it_is_inflated(tmp_path):
    path = _saved(tmp_path)
    rewrite(path, t_x=np.zeros(1 << 26, dtype=np.uint8))  # 64 MiB of zeros, a few KiB compressed
    assert os.path.getsize(path) < 1 << 20
    with pytest.raises(ReplayError, match="more than the .* it needs"):
        load(path, "cpu")


@pytest.mark.parametrize("damage, says", [
    ("text", "not a replay file"),
    ("truncate", "not a replay file"),
    ("unknown-op", "unknown op 'softmax'"),
    ("short-tensor", "tensor 'x' is truncated"),
    ("pickle", "not a replay file"),
])
def test_bad_file_is_a_one_line_error(tmp_path, damage, says):
    path = _saved(tmp_path)
    if damage == "text":
        with open(path, "w") as f:
            f.write("hello")
    elif damage == "truncate":
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    elif damage == "pickle":
        import pickle  # noqa: PLC0415 - writing one, to show it is never loaded

        with open(path, "wb") as f:
            pickle.dump({"meta": "x"}, f)
    else:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(bytes(arrays["meta"]).decode())
        if damage == "unknown-op":
            meta["op"] = "softmax"
        else:
            arrays["t_x"] = arrays["t_x"][:4]
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(path, **arrays)
        assert zipfile.is_zipfile(path)
    with pytest.raises(ReplayError) as e:
        load(path, "cpu")
    message = str(e.value)
    assert message.startswith(path) and says in message and "\n" not in message


def _run(*args, storage, cwd):
    """A fresh process run from ``cwd``, its Hypothesis storage pointed at an empty folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(storage)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.normcert_heavy  # an end-to-end run of the command in fresh processes: the heavy tier
def test_replay_command_reproduces_without_hypothesis_database(tmp_path):
    """A planted bug's saved failure fails again (exit 1) in a fresh process with no .hypothesis/,
    run from a folder outside the clone, and the same bits pass through a correct kernel (exit 0):
    through the printed ``normcert replay`` command and through pytest's ``--replay FILE`` form."""
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float32)
    case = Case("rms_norm", {"x": x, "weight": torch.ones(2)}, {"eps": 1e-2})
    impl = plugin("rms_norm=normcert.properties.tests.meta.planted:rms_eps_outside_sqrt")
    cmd = save_failure(impl, "accuracy", case, directory=str(tmp_path / "saved"))
    assert cmd.startswith("normcert replay ")
    path = shlex.split(cmd)[-1]
    empty, elsewhere = tmp_path / "no-hypothesis-database", tmp_path / "elsewhere"
    elsewhere.mkdir()
    bad = _run("-m", "normcert", "replay", path, storage=empty, cwd=elsewhere)
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "accuracy still fails for rms_norm:normcert.properties.tests.meta.planted:rms_eps_outside_sqrt" in bad.stdout
    good = _run("-m", "pytest", "-q", "-p", "no:xdist", "--pyargs", "normcert.properties.suite", "--normcert-replay", path,
                "--normcert-impl", "rms_norm=normcert.impls.eager:rms_norm", storage=empty, cwd=elsewhere)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    assert not any(empty.rglob("*")), "replay must not read or write a Hypothesis database"


@pytest.mark.parametrize("named", ["normcert.properties.meta.planted", "normcert.properties.tests.meta.planted.rms_norms"])
def test_a_planted_kernel_s_file_replays_by_its_name_before_the_house_move(tmp_path, named):
    """A replay file written before the house move (issue 44) names a planted kernel by its old
    module, ``normcert.properties.meta.planted``; one written since, by the module that defines it:
    both still replay, and fail again (exit 1), in a fresh process outside the clone."""
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float32)
    case = Case("rms_norm", {"x": x, "weight": torch.ones(2)}, {"eps": 1e-2})
    impl = plugin("rms_norm=normcert.properties.tests.meta.planted:rms_eps_outside_sqrt")
    path = shlex.split(save_failure(impl, "accuracy", case, directory=str(tmp_path / "saved")))[-1]
    rewrite(path, _set("impl", f"rms_norm={named}:rms_eps_outside_sqrt"))
    path = restamped(path)  # as its writer named it then
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = _run("-m", "normcert", "replay", path, storage=tmp_path / "storage", cwd=elsewhere)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "accuracy still fails for rms_norm:normcert.properties.tests.meta.planted" in r.stdout


@pytest.mark.parametrize("op", ["rms_norm_fp4_quant", "silu_and_mul_fp4_quant", "add_rms_norm_fp4_quant",
                                "rms_norm_gated"])
def test_a_replay_file_of_an_op_whose_scalars_depend_on_the_row_loads(tmp_path, op):
    """An FP4 op's block format (and a grouped gated norm's group size) is checked against the row
    length; the file's scalars are validated before the case is built, when there is no row yet, and
    that check must not read it (``normcert replay`` crashed, INTERNALERROR, on every FP4 file)."""
    case = Case.sample(op, torch.float32, rows=2, width=32)
    if op == "rms_norm_gated":
        case.scalars["group_size"] = 16
    kernel = f"normcert.impls.eager:{op}"
    meta, back = load(shlex.split(save_failure(plugin(f"{op}={kernel}"), "accuracy", case, str(tmp_path)))[-1], "cpu")
    assert back.scalars == case.scalars and meta["op"] == op
    for k, t in case.tensors.items():
        assert t is None or torch.equal(_bits(back.tensors[k]), _bits(t)), k


@pytest.mark.normcert_heavy  # a fresh process: the heavy tier
def test_the_printed_command_replays_a_users_own_kernel(tmp_path):
    """The replay command printed under a failure of the user's own kernel (a module of their folder,
    not normcert's registry nor its planted catalogue) runs as printed: it names the kernel with
    ``--impl``, since replay imports no module a file names unless told to (without it: exit 4)."""
    (tmp_path / "userkern.py").write_text(
        "import torch\n\ndef rms_norm(x, weight, eps):\n"
        "    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight\n")
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float32)
    case = Case("rms_norm", {"x": x, "weight": torch.ones(2)}, {"eps": 1e-2})
    sys.path.insert(0, str(tmp_path))
    try:
        impl = plugin("rms_norm=userkern:rms_norm")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("userkern", None)
    cmd = save_failure(impl, "accuracy", case, directory=str(tmp_path / "failures"))
    words = shlex.split(cmd)
    assert words[:4] == ["normcert", "replay", "--impl", "rms_norm=userkern:rms_norm"], cmd
    ran = _run("-m", *words, storage=tmp_path / "empty", cwd=tmp_path)
    assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "accuracy still fails for rms_norm:userkern:rms_norm" in ran.stdout
