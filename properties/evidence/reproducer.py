"""``normcert replay FILE --export repro.py``: a standalone reproducer of one saved failure, for a bug
report in the kernel's own repository.

The script needs torch, numpy and the kernel only (never normcert).  It holds the case (the replay
file inlined, base64, up to ``INLINE_BYTES``; a larger one is read from the path it was exported from,
or the path given as its first argument), builds each tensor bit for bit with its strides as
``replay.load`` does, calls the kernel as normcert called it (its arguments as the op's record passes
them, traced by name: ``call_text``; the recorded calling context: grad mode, inputs that require
grad, default dtype, a fresh thread, a call on negated inputs before; parameters held as
``nn.Parameter``, the case's values written back between the two calls by the recorded path,
deterministic algorithms: ``harness.calling``'s, in the script's ``built`` and ``written``), and holds the failing output
to the exact values and bounds the file stores (``elements``: the ``TOP_K`` worst elements and the
failing row's window, from ``oracle.assessment.worst_elements``) by the rule of
``oracle.assessment.assess`` for a plain (not quantised) output:

    at an element with exact value e and bound b, output a fails  <=>  claimed and (NaN(a) != NaN(e)
    or (e = +-inf and a != e) or (e finite and not (|a - e| <= b) and not a reaching the format's
    max where e + b does))

The line it prints for the worst failing element (largest |a - e| / b) is normcert replay's:
"<property> still fails for <kernel id>: [in context ...: ]<output>[i, j]: got ..., exact ...,
|error| ... > bound ... (... ulp of <format>)"; exit status 1.  Where every stored element holds it
prints "<property> holds for <kernel id> on the N stored elements of <output>" and exits 0: the
stored elements are the ones that failed, not the whole output (``normcert replay`` checks that).

Exported: accuracy and extremes failures of a kernel called out of place, on an op whose outputs are
plain values (no quantised, packed, scaled or swizzled output); anything else is refused in one line
(``ExportError``).  The script begins with ``files.MARKS["reproducer"]``: an export replaces only a
file it wrote.
"""
from __future__ import annotations

import base64
import json
import os
import re

from ...oracle.formats import BY_NAME, fmt
from .. import families
from ..harness.calling import _rewritten, leaf_names, parameters
from .files import why_not_writable, write_atomic
from .replay import load, tested

INLINE_BYTES = 256 * 1024
"""A replay file up to this size is inlined in the script (base64); a larger one is read from its path."""

EXPORTED = ("accuracy", "extremes")
"""The families whose failure is one forward call held to the exact values: what a script reproduces."""


class ExportError(ValueError):
    """A failure the reproducer cannot stand for, or a path it cannot write; one line."""


class _Name:
    """An argument standing for itself by name while a record's ``call`` is traced."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"args[{self.name!r}]"


def call_text(record, args: dict) -> str:
    """How the op's record calls a kernel on ``args``, as source: "kernel(args['x'], args['weight'],
    args['eps'])", each argument the record passes by its name (options by keyword).  ExportError where the record does
    more than pass its arguments along."""
    seen = []

    def kernel(*positional, **keywords):
        seen.append((positional, keywords))
        return None

    named = {k: None if v is None else _Name(k) for k, v in args.items()}  # an option given as None is left out
    try:
        record.call(kernel, named)
    except Exception as e:  # noqa: BLE001 - a record that computes with its arguments: not traceable
        raise ExportError(f"{record.name}'s call does more than pass its arguments ({type(e).__name__})") from None
    if len(seen) != 1 or not all(v is None or isinstance(v, _Name) for v in (*seen[0][0], *seen[0][1].values())):
        raise ExportError(f"{record.name}'s call does more than pass its arguments along")
    positional, keywords = seen[0]
    return "kernel(" + ", ".join([repr(v) for v in positional] + [f"{k}={v!r}" for k, v in keywords.items()]) + ")"


def _eligible(meta: dict, case, module: str, attr: str, convention: str) -> str:
    """Why the failure of ``meta`` and ``case`` cannot be exported ("" if it can)."""
    rec = case.record
    elements = meta.get("elements")
    if meta["property"] not in EXPORTED:
        return (f"a {meta['property']} failure is not exported: a reproducer stands for one forward call held to "
                f"exact values ({', '.join(EXPORTED)} failures)")
    if not isinstance(elements, dict) or elements.get("kind") != "oracle" or elements.get("output") not in rec.outputs:
        return "the file holds no exact values of a failing output (a failure the kernel raised or a contract check)"
    if any(o.quantised or o.packed or o.scale or o.layout_arg or o.format_arg or o.rounded for o in rec.outs):
        return f"{rec.name} has quantised, packed, scaled or bit-exact outputs: not exported"
    if convention:
        return f"the kernel is called @{convention}: a reproducer calls it out of place only"
    if not (_DOTTED.fullmatch(module) and _DOTTED.fullmatch(attr)):
        return f"{module}:{attr} is not MODULE:ATTR of Python names"
    return ""


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def export(replay: str, output: str, given: list[str]) -> str:
    """Write the reproducer of the replay file ``replay`` to ``output``: of the first kernel of
    ``given`` (OP=MODULE:ATTR, ``--impl``) for the file's op, else of the file's own kernel, named
    "OP:MODULE:ATTR" as normcert names a kernel given so.  Returns what was written, in one line;
    ExportError (one line) where it cannot be."""
    meta, case = load(replay, "cpu")
    spec = next((g for g in given if g.partition("=")[0] == meta["op"]), meta["impl"])
    op, _, target = spec.partition("=")
    impl_id = f"{op}:{target}"
    base, _, convention = target.partition("@")
    module, _, attr = base.partition(":")
    problem = _eligible(meta, case, module, attr, convention)
    if problem:
        raise ExportError(f"{replay}: {problem}")
    _check_output(output, replay)
    with open(replay, "rb") as f:
        data = f.read()
    rec = case.record
    form = fmt(BY_NAME[meta["elements"]["format"]])
    family = families.BY_NAME[meta["property"]]
    context = case.context
    leaves = leaf_names(case, context) if rec.grads else ()
    described = context.describe(tested(family))
    settings = {"impl_id": impl_id, "module": module, "attr": attr, "property": meta["property"],
                "prefix": f"in context {described}: " if context != tested(family) else "",
                "output": meta["elements"]["output"], "outputs": list(rec.outputs), "format": form.name,
                "p": form.p, "emin": form.emin, "max": float(form.max), "grad": context.grad,
                "leaves": list(leaves), "default_dtype": context.dtype, "fresh": context.thread == "fresh",
                "rewritten": list(_rewritten(case, context.state)), "scalars": meta["scalars"],
                **_held_and_written(case, context)}
    inline = base64.b64encode(data).decode() if len(data) <= INLINE_BYTES else ""
    text = TEMPLATE.format(settings=repr(json.dumps(settings)), call=call_text(rec, case.oracle_args()),
                           inline=repr(inline), path=repr(os.path.abspath(replay)), spec=f"{op}={module}:{attr}")
    write_atomic(output, text)
    os.chmod(output, 0o755 & ~_umask())
    how = "the case inlined" if inline else f"reading {os.path.abspath(replay)}"
    return f"{output}: a reproducer of {meta['property']} for {impl_id} ({how}); run: python {output}"


def _held_and_written(case, context) -> dict:
    """The script's settings for the context fields ``built`` and ``written`` apply: how the
    parameters are held, the state's write path, deterministic algorithms."""
    return {"held": context.held, "params": list(parameters(case)), "state": context.state,
            "deterministic": context.deterministic}


def _check_output(output: str, replay: str) -> None:
    """ExportError unless ``output`` may take the reproducer (``files.why_not_writable``: never the
    replay file, a folder, a link or somebody else's file)."""
    problem = why_not_writable(output, "reproducer", {replay: "the replay file exported"})
    if problem:
        raise ExportError(f"--export {output}: {problem}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


TEMPLATE = '''#!/usr/bin/env python3
# normcert reproducer: {spec}
"""Reproduces a failure normcert found: needs torch, numpy and the kernel, not normcert.

Run it where the kernel's module imports (its folder, or with it installed): exit status 1 and the
failure line while the kernel still fails, 0 once the stored failing elements are within bound.
Optional argument: the replay file, where the case is not inlined.
"""
import base64
import contextlib
import importlib
import io
import json
import math
import os
import sys
import threading

import numpy as np
import torch

S = json.loads({settings})
INLINE = {inline}
PATH = {path}


def load_case(device):
    data = base64.b64decode(INLINE) if INLINE else open(sys.argv[1] if len(sys.argv) > 1 else PATH, "rb").read()
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        tensors = {{}}
        for name, m in meta["tensors"].items():
            if m is None:
                tensors[name] = None
                continue
            dtype = getattr(torch, m["dtype"])
            raw = z["t_" + name]
            flat = torch.from_numpy(raw.copy()).view(dtype) if raw.size else torch.empty(0, dtype=dtype)
            flat = flat.to(device)
            span = raw.size // flat.element_size() if raw.size else 0
            tensors[name] = (torch.as_strided(flat, m["shape"], m["stride"], m["offset"]) if span
                             else flat[:0].reshape(m["shape"]))
    return meta, tensors


def the_kernel():
    try:
        module = importlib.import_module(S["module"])
    except ModuleNotFoundError:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(S["module"])
    fn = module
    for part in S["attr"].split("."):
        fn = getattr(fn, part)
    return fn


# the calling context's parameters (normcert's harness.calling): held as S["held"] says, written
# between the two calls by the path of S["state"], under deterministic algorithms where S["deterministic"]


def built(t, storage, name):
    """A new tensor object over storage, laid out as t: an nn.Parameter where the context holds
    the parameters so, requiring grad where asked; built one way, so each starts at one _version."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())
    return holding(flat, name)


def holding(flat, name):
    requires = name in S["leaves"]
    if S["held"] != "tensor" and name in S["params"]:
        return torch.nn.Parameter(flat, requires_grad=requires)
    return flat.detach().requires_grad_(requires)


def made(args):
    """The context's own copies of the leaves, the parameters it holds and the inputs it rewrites,
    the rewritten ones holding their negated values."""
    held = S["params"] if S["held"] != "tensor" else []
    for name in dict.fromkeys(S["leaves"] + S["rewritten"] + held):
        storage = args[name].detach().untyped_storage().clone()
        if name in S["rewritten"]:
            torch.empty(0, dtype=args[name].dtype, device=args[name].device).set_(storage).neg_()
        args[name] = built(args[name], storage, name)


def written(args, values):
    """The case's values written back into the rewritten inputs by the state's path."""
    names, state = S["rewritten"], S["state"]
    if state == "params replaced":  # the old weight freed, a new one built over its memory: its id and address
        for name in names:
            storage = args[name].untyped_storage()
            storage.copy_(values[name].detach().untyped_storage())
            flat = torch.empty(0, dtype=values[name].dtype, device=values[name].device).set_(
                storage, values[name].storage_offset(), values[name].shape, values[name].stride())
            del args[name]
            args[name] = holding(flat, name)
    elif state == "params load_state_dict":
        module = torch.nn.Module()
        for name in names:
            if isinstance(args[name], torch.nn.Parameter):
                module.register_parameter(name, args[name])
            else:
                module.register_buffer(name, args[name])
        module.load_state_dict({{name: values[name] for name in names}})
    else:
        for name in names:
            if state == "params .data.copy_":
                args[name].data.copy_(values[name])
            else:
                with torch.no_grad():
                    if state == "params copy_ under no_grad":
                        args[name].copy_(values[name])
                    else:  # neg_() on the tensor itself: the case's values again
                        args[name].neg_()


@contextlib.contextmanager
def deterministic():
    """torch.use_deterministic_algorithms as the context had it (warn_only, as normcert sets it); undone after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    if S["deterministic"] == "on":
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def called(kernel, args):
    values = dict(args)
    made(args)
    grad = {{"on": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}}[S["grad"]]

    def once():
        result = []

        def body():
            with grad():
                result.append({call})
        if S["fresh"]:
            thread = threading.Thread(target=body)
            thread.start()
            thread.join()
        else:
            body()
        return result[0]

    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, S["default_dtype"]))
    try:
        with deterministic():
            if S["rewritten"]:
                once()
                written(args, values)
            out = once()
    finally:
        torch.set_default_dtype(before)
    outs = (out,) if len(S["outputs"]) == 1 else tuple(out)
    return outs[S["outputs"].index(S["output"])]


def ulp(e):
    e = abs(e)
    exponent = math.frexp(e)[1] - 1 if e > 0 and math.isfinite(e) else S["emin"]
    return math.ldexp(1.0, max(exponent, S["emin"]) - S["p"] + 1)


def judged(a, e, b):
    """(fails, over the bound, error / bound, |error|, ulps) of output value a against exact value e
    under bound b, by normcert's rule (oracle/assessment.py, ``assess``, a plain output)."""
    finite = math.isfinite(e)
    if not (math.isfinite(b) or (not finite and b != -math.inf)):  # outside the model's claim
        return False, False, 0.0, 0.0, 0.0
    err = abs(a - e)
    fin = finite and not (math.isinf(a) and (e + b >= S["max"] if a > 0 else e - b <= -S["max"]))
    over = fin and not err <= b
    fails = over or math.isnan(a) != math.isnan(e) or (math.isinf(e) and a != e)
    units = (err / b if b > 0 else (math.inf if err > 0 else 0.0)) if math.isfinite(err) else math.inf
    return fails, over, units if fin else 0.0, err, err / ulp(e) if fin and math.isfinite(err) else 0.0


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    meta, tensors = load_case(device)
    elements = meta["elements"]
    args = dict(tensors)
    args.update(S["scalars"])
    got = called(the_kernel(), args).detach().to("cpu", torch.float64).reshape(elements["shape"]).numpy()
    stored = {{tuple(r["index"]): (float(r["exact"]), float(r["bound"])) for r in elements["top"]}}
    row = elements["row"]
    for j, (e, b) in enumerate(zip(row["exact"], row["bound"])):
        stored.setdefault(tuple(row["index"]) + (row["start"] + j,), (float(e), float(b)))
    worst = None  # normcert's: the failing element over the bound by most, else the first failing one
    for index in sorted(stored):
        e, b = stored[index]
        a = float(got[index])
        fails, over, units, err, ulps = judged(a, e, b)
        if fails and (worst is None or (over, units if over else 0.0) > worst[0]):
            worst = ((over, units if over else 0.0), index, a, e, b, err, ulps)
    if worst is None:
        print(f"{{S['property']}} holds for {{S['impl_id']}} on the {{len(stored)}} stored elements of {{S['output']}}")
        return 0
    _, index, a, e, b, err, ulps = worst
    print(f"{{S['property']}} still fails for {{S['impl_id']}}: {{S['prefix']}}{{S['output']}}{{list(index)}}: "
          f"got {{a!r}}, exact {{e!r}}, |error| {{err:.3g}} > bound {{b:.3g}} ({{ulps:.3g}} ulp of {{S['format']}})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''
