"""``normcert replay FILE --export repro.py``: a standalone reproducer of one saved failure, for a bug
report in the kernel's own repository.

The script needs torch and the kernel only (never normcert), and numpy where it reads the replay
file.  It holds the case: a small one (``literals.LITERAL_ELEMENTS``) as Python literals, ``torch.tensor([...], dtype=...)`` with each value
spelled exactly (``literals.source``), what a maintainer pastes into an upstream issue; a larger one
as the replay file inlined, base64, up to ``INLINE_BYTES``; a larger one still read from the path it
was exported from, or the path given as its first argument.  Each tensor is built bit for bit with its
strides as ``replay.load`` builds it.  It calls the kernel as normcert called it (its arguments as the op's record passes
them, traced by name: ``call_text``; in every field of the recorded calling context, as
``calling.effective`` applies it to a kernel given with --impl: grad mode, inputs that require grad,
default dtype, the calling thread, a call on negated inputs before, autocast, torch's intra-op thread
count, parameters held as ``nn.Parameter``, the case's values written back between the two calls by
the recorded path, deterministic algorithms; a file recording a field or value the script cannot apply is refused, ``APPLIED``), and holds the failing output
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

No field of the file is written into the script but as data: the settings as a JSON string literal,
the case as a base64 literal, and the kernel's op, module and attribute (the file's ``impl``, which
``replay.load`` holds to OP=MODULE:ATTR of Python names, OP the file's op) in its first comment line.
Without ``--impl`` the script imports the kernel the file names only where it is normcert's own (a
registry or planted kernel): any other is named with ``--impl``, as ``normcert replay`` asks.
"""
from __future__ import annotations

import base64
import json
import os
import re
import textwrap
from dataclasses import dataclass
from typing import Callable

from ...oracle.formats import BY_NAME, fmt
from .. import families
from ..harness.calling import REBUILDS, _rewritten, effective, leaf_names, parameters
from .files import why_not_writable, write_atomic
from .literals import LITERAL_ELEMENTS, source, span
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


def _untrusted(spec: str) -> str:
    """Why the kernel a file names by itself (``spec``, validated by ``load``) is not imported by its
    reproducer without ``--impl``: one outside normcert's own modules (its registry's, the planted
    kernels) is imported only where the user names it, as ``normcert replay`` imports it ("" where
    it is normcert's own)."""
    module, _, attr = spec.partition("=")[2].partition(":")
    if module.partition(".")[0] == "normcert" and attr.isidentifier():
        return ""
    return f"the file names the kernel {spec}, not one of normcert's own; if you trust it, pass --impl {spec}"


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def export(replay: str, output: str, given: list[str]) -> str:
    """Write the reproducer of the replay file ``replay`` to ``output``: of the first kernel of
    ``given`` (OP=MODULE:ATTR, ``--impl``) for the file's op, else of the file's own kernel where it
    is normcert's own (``_untrusted``), named "OP:MODULE:ATTR" as normcert names a kernel given so.
    Returns what was written, in one line; ExportError (one line) where it cannot be."""
    meta, case = load(replay, "cpu")  # its "impl" validated: OP=MODULE:ATTR of Python names, OP the file's op
    op = meta["op"]
    mine = next((g for g in given if g.partition("=")[0] == op), None)
    spec = mine or meta["impl"]
    target = spec.partition("=")[2]
    impl_id = f"{op}:{target}"
    base, _, convention = target.partition("@")
    module, _, attr = base.partition(":")
    problem = _eligible(meta, case, module, attr, convention) or ("" if mine else _untrusted(spec))
    if problem:
        raise ExportError(f"{replay}: {problem}")
    _check_output(output, replay)
    with open(replay, "rb") as f:
        data = f.read()
    rec = case.record
    form = fmt(BY_NAME[meta["elements"]["format"]])
    family = families.BY_NAME[meta["property"]]
    context = effective(_Named(op, target), case)  # as ``normcert replay`` calls a kernel given with --impl
    problem = unapplied(context)
    if problem:
        raise ExportError(f"{replay}: {problem}")
    leaves = leaf_names(case, context) if rec.grads else ()
    described = context.describe(tested(family))
    settings = {"impl_id": impl_id, "module": module, "attr": attr, "property": meta["property"],
                "prefix": f"in context {described}: " if context != tested(family) else "",
                "output": meta["elements"]["output"], "outputs": list(rec.outputs), "format": form.name,
                "p": form.p, "emin": form.emin, "max": float(form.max), "context": context.as_dict(),
                "leaves": list(leaves), "rewritten": list(_rewritten(case, context.state)), "scalars": meta["scalars"],
                "params": list(parameters(case)), "elements": meta["elements"]}
    literal = _literal(case.tensors)
    inline = base64.b64encode(data).decode() if literal is None and len(data) <= INLINE_BYTES else ""
    text = TEMPLATE.format(imports=_imports(literal is None), needs="torch" if literal else "torch, numpy",
                           settings=_wrapped(json.dumps(settings)), call=call_text(rec, case.oracle_args()),
                           load_case=literal or ARCHIVED.format(inline=repr(inline), path=repr(os.path.abspath(replay))),
                           spec=f"{op}={module}:{attr}", rebuilds=REBUILDS)
    write_atomic(output, text)
    os.chmod(output, 0o755 & ~_umask())
    how = ("the case as literals" if literal else "the case inlined" if inline
           else f"reading {os.path.abspath(replay)}")
    return f"{output}: a reproducer of {meta['property']} for {impl_id} ({how}); run: python {output}"


@dataclass(frozen=True)
class _Named:
    """The kernel a reproducer calls, as ``calling.effective`` reads it, not imported: a plug-in's
    (its backward undeclared, as ``--impl`` gives one)."""

    op: str
    target: str
    backward: None = None


APPLIED: dict[str, Callable[[str], bool]] = {
    "grad": lambda v: v in ("on", "no_grad", "inference_mode"),
    "requires": lambda v: True,  # the leaves (``calling.leaf_names``), named in the script's settings
    "dtype": lambda v: v in ("float32", "bfloat16", "float16"),
    "thread": lambda v: v in ("worker", "fresh", "importer"),
    "dy": lambda v: v == "contiguous",  # a cotangent's layout: no backward is called
    "state": lambda v: v in ("fresh", "x rewritten", "params rewritten", "params .data.copy_",
                             "params copy_ under no_grad", "params load_state_dict", "params replaced"),
    "autocast": lambda v: v in ("off", "on"),
    "threads": lambda v: v == "run" or (v.isdigit() and int(v) >= 1),
    "held": lambda v: v in ("tensor", "Parameter", "trainable Parameter"),
    "deterministic": lambda v: v in ("off", "on"),
}
"""Each calling-context field (``search.context.Context``) the script applies, with the values it
applies: grad (the grad mode entered around the call), requires (the inputs made leaves that require
grad), dtype (the default dtype), thread (the thread that calls: a long-lived one that did not import
the kernel, a fresh one per call, or the importer, the main thread), state (a call on the inputs
negated first, then the case's values written back by the recorded path: ``written``), autocast
(``torch.autocast`` of the script's device, bfloat16), threads (torch's intra-op thread count, on
CPU), held (the parameters as plain tensors or ``nn.Parameter`` objects: ``holding``),
deterministic (``torch.use_deterministic_algorithms``, warn-only as normcert sets it); dy is a
backward's.  The script's ``AROUND`` table enters the
fields applied around each call.  A field this table lacks, or a value it does not accept, is
refused (``unapplied``): a field added to ``Context`` is never dropped from a reproducer unsaid."""


def unapplied(context) -> str:
    """Why the script cannot call a kernel in ``context`` (a field or value ``APPLIED`` lacks), "" where
    it can."""
    for name, value in context.as_dict().items():
        if name not in APPLIED or not APPLIED[name](value):
            return (f"the file records the calling context {name}={value}, which a reproducer cannot apply "
                    f"(it applies {', '.join(APPLIED)}): not exported")
    return ""


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
"""Reproduces a failure normcert found: needs {needs} and the kernel, not normcert.

Run it where the kernel's module imports (its folder, or with it installed): exit status 1 and the
failure line while the kernel still fails, 0 once the stored failing elements are within bound.
"""
{imports}
import torch

S = json.loads(
    {settings}
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


{load_case}

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


def holding(flat, name):
    """flat as the context holds it: an nn.Parameter where it holds the parameters so, requiring grad
    where asked."""
    requires = name in S["leaves"]
    if S["context"]["held"] != "tensor" and name in S["params"]:
        return torch.nn.Parameter(flat, requires_grad=requires)
    return flat.detach().requires_grad_(requires)


def made(args):
    """The context's own copies of the leaves, the parameters it holds and the inputs it rewrites (each
    a new tensor over a copy of its storage, laid out as the case's), the rewritten ones negated."""
    held = S["params"] if S["context"]["held"] != "tensor" else []
    for name in dict.fromkeys(S["leaves"] + S["rewritten"] + held):
        t = args[name]
        storage = t.detach().untyped_storage().clone()
        if name in S["rewritten"]:
            torch.empty(0, dtype=t.dtype, device=t.device).set_(storage).neg_()
        flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())
        args[name] = holding(flat, name)


def written(args, values):
    """The case's values written back into the rewritten inputs by the recorded state's path."""
    names, state = S["rewritten"], S["context"]["state"]
    if state == "params replaced":  # the old weight freed, a new one built over its memory: its id and address
        for name in names:
            storage = args[name].untyped_storage()
            storage.copy_(values[name].detach().untyped_storage())
            v = values[name]
            flat = torch.empty(0, dtype=v.dtype, device=v.device).set_(storage, v.storage_offset(), v.shape, v.stride())
            gone = id(args[name])
            del args[name]
            misses = []  # built until one takes the dead weight's id (CPython hands a freed object's memory
            for _ in range({rebuilds}):  # to a later object of its size, not always the first one built)
                new = holding(flat, name)
                if id(new) == gone:
                    break
                misses.append(new)
            args[name] = new
            del misses
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
def deterministic(value):
    """torch.use_deterministic_algorithms as the context had it (warn-only, as normcert sets it), put back after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    if value == "on":
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@contextlib.contextmanager
def default_dtype(value):
    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, value))
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def intra_op_threads(value):
    """torch's intra-op thread count at value ("run": as it is), on CPU alone (a CPU setting), put back after."""
    before = torch.get_num_threads()
    if value != "run" and DEVICE == "cpu":
        torch.set_num_threads(int(value))
    try:
        yield
    finally:
        torch.set_num_threads(before)


AROUND = {{  # the recorded context's fields entered around each call, in the thread that calls
    "grad": lambda v: {{"on": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}}[v](),
    "dtype": default_dtype,
    "autocast": lambda v: torch.autocast(DEVICE, torch.bfloat16) if v == "on" else contextlib.nullcontext(),
    "threads": intra_op_threads,
    "deterministic": deterministic,
}}
# the others: requires, held and state (the inputs: ``made``, ``written``), thread (which thread calls:
# ``once``), dy (a backward's)


def called(kernel, args):
    values = dict(args)
    made(args)
    worker = concurrent.futures.ThreadPoolExecutor(1)  # a long-lived thread that did not import the kernel

    def body():
        with contextlib.ExitStack() as stack:
            for name, enter in AROUND.items():
                stack.enter_context(enter(S["context"][name]))
            return {call}

    def once():
        thread = S["context"]["thread"]
        if thread == "importer":  # the main thread imported the kernel
            return body()
        if thread == "fresh":  # a thread started for this call alone
            with concurrent.futures.ThreadPoolExecutor(1) as fresh:
                return fresh.submit(body).result()
        return worker.submit(body).result()

    with worker:
        if S["rewritten"]:
            once()
            written(args, values)
        out = once()
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
    tensors = load_case(DEVICE)
    elements = S["elements"]
    args = dict(tensors)
    args.update(S["scalars"])
    got = called(the_kernel(), args).detach().to("cpu", torch.float64).reshape(elements["shape"])
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


ARCHIVED = '''INLINE = {inline}
PATH = {path}


def load_case(device):
    """The case's tensors, bit for bit, from the replay file: inlined, else the first argument or PATH."""
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
    return tensors
'''
"""The script's ``load_case`` where the case is the replay file (inlined or read from a path)."""


def _literal(tensors: dict) -> str | None:
    """The script's ``load_case`` building ``tensors`` from literals (``literals.source``), None where
    the case holds more than ``LITERAL_ELEMENTS`` elements or a tensor has no literal."""
    if sum(span(t) for t in tensors.values() if t is not None) > LITERAL_ELEMENTS:
        return None
    built = {name: source(t) for name, t in tensors.items()}
    if any(text is None for text in built.values()):
        return None
    lines = "".join(textwrap.fill(f"{name!r}: {text},", 108, initial_indent=" " * 8, subsequent_indent=" " * 12,
                                  break_on_hyphens=False, break_long_words=False) + "\n" for name, text in built.items())
    return f'def load_case(device):\n    """The case\'s tensors, bit for bit."""\n    return {{\n{lines}    }}\n'


STANDARD = ("concurrent.futures", "contextlib", "importlib", "json", "math", "os", "sys")
"""The standard modules every script imports; one that reads the replay file adds ``ARCHIVE``."""
ARCHIVE = ("base64", "io")


def _imports(archived: bool) -> str:
    """The script's imports before torch's: the standard modules it uses, and numpy where it reads the
    replay file (a literal case needs torch alone)."""
    names = sorted(STANDARD + (ARCHIVE if archived else ()))
    return "\n".join(f"import {name}" for name in names) + ("\n\nimport numpy as np" if archived else "")


def _wrapped(text: str, width: int = 96) -> str:
    """``text`` as string literals of at most ``width`` characters each, one a line, which Python
    joins into ``text`` again (adjacent literals inside the call's parentheses)."""
    return "\n    ".join(repr(text[k:k + width]) for k in range(0, len(text), width)) or "''"
