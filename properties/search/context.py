"""The calling context: how a kernel is called, drawn per example like its inputs.

A test calls a kernel one way (``AS_TESTED``); a model calls it in many, and each way may take its
own path through the kernel.  A ``Context`` is one such way, a record of independent fields, each
drawn by the search with its as-tested value first (``sampled_from`` order), so Hypothesis shrinks
a counterexample towards the as-tested context and the one named is the smallest that shows it:

    grad       the grad mode of the call: "on" (``torch.enable_grad``), "no_grad"
               (``torch.no_grad``), "inference_mode" (``torch.inference_mode``)
    requires   the inputs that require grad, as fresh leaves with the case's values and layout:
               "none", "all" (every input of ``Op.grads_in``), or one name (that leaf alone: a
               frozen weight, LoRA / PEFT, is requires = "x").  The forward is held to the oracle in
               every one; the gradients family asks for exactly these gradients
    dtype      ``torch.get_default_dtype()`` during the call: "float32", "bfloat16", "float16" (a
               model that sets a half default); the output's dtype still decides the bound
    thread     the Python thread that calls: "worker" (the session's long-lived kernel thread),
               "fresh" (a thread started for this call alone, under the same watchdog), or "importer"
               (the thread that imported the kernel's module in this process, ``impls.importer``: a
               module's import-time set-up of thread-local state holds there alone)
    autocast   "off", or "on": inside ``torch.autocast(device, bfloat16)`` (CPU autocast is
               bfloat16 too), on float32 cases of a kernel a training step calls, as served's
               autocast mode; the output's dtype the contract states still decides the bound
    threads    torch's intra-op thread count during the call: "run" (as the run left it), "1", "2"
    dy         the layout of the cotangent dy the backward is handed, with the same values V:
               "contiguous"; "transposed" (dy = W.mT, W contiguous holding V.mT: the output viewed
               transposed before use); "sliced" (dy = B[..., :n] of a buffer B twice as wide);
               "expanded" (dy_ij = v_j for every row i, stride 0 over the rows: y's rows summed
               before use, V having equal rows)
    state      what happened between the call checked and the call before it on the same tensors:
               "fresh" (no call before); "x rewritten" (a call on -x, then x's own storage
               overwritten with the case's x); "params rewritten" (a call with each parameter
               w (weight, bias, a sublayer's matrix) replaced by -w, then their storage overwritten
               with the case's values, as an optimizer step or ``load_state_dict`` does).  The call checked is always held to the
               oracle of the case's values

A family draws the fields it exercises (``contexts``) and leaves the others as tested.  The harness
applies a context in one place (``properties.harness.calling``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from hypothesis import strategies as st

from .buckets import Bucket, cycled

GRAD = ("on", "no_grad", "inference_mode")
DTYPES = ("float32", "bfloat16", "float16")
THREADS = ("worker", "fresh", "importer")
AUTOCAST = ("off", "on")
POOL = ("run", "1", "2")
DY = ("contiguous", "transposed", "sliced", "expanded")
STATES = ("fresh", "x rewritten", "params rewritten")


@dataclass(frozen=True)
class Context:
    grad: str = "on"
    requires: str = "none"
    dtype: str = "float32"
    thread: str = "worker"
    dy: str = "contiguous"
    state: str = "fresh"
    autocast: str = "off"
    threads: str = "run"

    def describe(self, tested: "Context | None" = None) -> str:
        """The fields that differ from ``tested`` (default: ``AS_TESTED``), as "field=value, ...";
        "as tested" where none does."""
        base = tested or AS_TESTED
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name) != getattr(base, f.name)]
        return ", ".join(parts) or "as tested"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


AS_TESTED = Context()
"""How every family called a kernel before contexts were drawn: grad on, plain (not requiring grad)
inputs, float32 default, the worker thread, a contiguous dy, fresh buffers, no autocast, torch's
thread count as the run left it."""

LATER = {"autocast": "off", "threads": "run"}
"""The fields added after replay files first stored a context, with the value a file without them
replays in (the as-tested one)."""

TRAINING = Context(requires="all")
"""The gradients family's as-tested context: every input a leaf that requires grad."""


def choices(name: str, leaves: tuple[str, ...], training: bool = False) -> tuple[str, ...]:
    """The values field ``name`` may take for a case whose gradient inputs are ``leaves``; ``training``:
    a gradient is asked for (requires is not "none"; a lone leaf is "all")."""
    if name == "requires":
        if training:
            return ("all", *leaves) if len(leaves) > 1 else ("all",)
        return ("none", "all", *leaves) if leaves else ("none",)
    return {"grad": GRAD, "dtype": DTYPES, "thread": THREADS, "dy": DY, "state": STATES, "autocast": AUTOCAST,
            "threads": POOL}[name]


def problem(value, leaves: tuple[str, ...], training: bool = False) -> str | None:
    """Why ``value`` (a replay file's "context") is not a context for a case with gradient inputs
    ``leaves`` (None: it is); ``training`` as ``choices`` takes it.  A field of ``LATER`` may be
    absent (``stored``)."""
    names = [f.name for f in fields(Context)]
    if not isinstance(value, dict) or not set(names) - set(LATER) <= set(value) <= set(names):
        return f"expected an object with the fields {', '.join(names)}"
    value = stored(value)
    for k in names:
        allowed = choices(k, leaves, training)
        if value[k] not in allowed:
            return f"{k} {value[k]!r}: expected one of {', '.join(map(repr, allowed))}"
    return None


AWAY = 2
"""How many times over a random search lists each value but the as-tested one (``contexts``): every
other family calls as tested, and a field's other values are what this search adds (at 2, a bug of
one requires value among three meets about 40% of the cases instead of a third)."""


def stored(value: dict) -> dict:
    """A replay file's context with each absent field of ``LATER`` as tested."""
    return {**LATER, **value}


@st.composite
def contexts(draw, leaves: tuple[str, ...], tested: Context, drawn: tuple[str, ...], bucket: Bucket | None = None,
             training: bool = False):
    """A ``Context``: each field in ``drawn`` sampled with ``tested``'s value first, the others
    ``tested``'s; ``training`` as ``choices`` takes it.  In a random search each other value is
    listed ``AWAY`` times (a field of k values keeps its as-tested one with probability
    1 / (AWAY (k - 1) + 1)), and a counterexample still shrinks towards the first; under a bucket
    each value once, the next in turn (``buckets.cycled``)."""
    values = {}
    for name in drawn:
        options = choices(name, leaves, training)
        first = getattr(tested, name)
        others = tuple(o for o in options if o != first) if first in options else options[1:]
        first = first if first in options else options[0]
        values[name] = draw(cycled((first,) + others, bucket, f"context {name}") if bucket is not None
                            else st.sampled_from((first,) + others * AWAY))
    return Context(**{**tested.as_dict(), **values})


def tally(counts: dict[str, dict[str, int]], context: Context) -> None:
    """Count ``context`` into ``counts`` (field -> value -> cases)."""
    for name, value in context.as_dict().items():
        per = counts.setdefault(name, {})
        per[value] = per.get(value, 0) + 1


def ran(counts: dict[str, dict[str, int]], drawn: tuple[str, ...]) -> str:
    """A result's words for the contexts its checked cases ran in, per drawn field, each value with
    its count in ``choices`` order: "contexts: grad on 9, no_grad 2; requires none 6, all 5"."""
    parts = []
    for name in drawn:
        seen = counts.get(name, {})
        order = [v for v in choices(name, ()) if v in seen] + [v for v in seen if v not in choices(name, ())]
        parts.append(f"{name} " + ", ".join(f"{v} {seen[v]}" for v in order))
    return "contexts: " + "; ".join(parts)
