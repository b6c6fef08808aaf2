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
    dtype      ``torch.get_default_dtype()`` during the call (and its backward): "float32", "bfloat16", "float16" (a
               model that sets a half default); the output's dtype still decides the bound
    thread     the Python thread that calls: "worker" (the session's long-lived kernel thread),
               "fresh" (a thread started for this call alone, under the same watchdog), or "importer"
               (the thread that imported the kernel's module in this process, ``impls.importer``: a
               module's import-time set-up of thread-local state holds there alone)
    autocast   "off", or "on": inside ``torch.autocast(device, bfloat16)`` (CPU autocast is
               bfloat16 too), on float32 cases of a kernel a training step calls, as served's
               autocast mode; the output's dtype the contract states still decides the bound
    threads    torch's intra-op thread count during the call (and its backward): "run" (as the run
               left it), "1", "2", "3" (an odd count: a reduction tree over per-thread partial sums
               that pairs them up is wrong at 3 and right at every power of two; the core count is
               served's threads=N mode)
    dy         the layout of the cotangent dy the backward is handed, with the same values V:
               "contiguous"; "transposed" (dy = W.mT, W contiguous holding V.mT: the output viewed
               transposed before use); "sliced" (dy = B[..., :n] of a buffer B twice as wide);
               "expanded" (dy_ij = v_j for every row i, stride 0 over the rows: y's rows summed
               before use, V having equal rows)
    state      what happened between the call checked and the call before it on the same tensors:
               "fresh" (no call before); "x rewritten" (a call on -x, then x's own storage
               overwritten with the case's x by ``neg_()``); or a call with each parameter w (weight,
               bias, a sublayer's matrix) holding -w, then the case's values written back as a
               loader or an optimizer writes them:
                 "params rewritten"            ``w.neg_()`` on the tensor itself (bumps ``w._version``)
                 "params .data.copy_"          ``w.data.copy_(new)``: vLLM's default weight loader, an
                                               RL weight sync (``w._version`` does not move)
                 "params copy_ under no_grad"  ``w.copy_(new)`` inside ``torch.no_grad()``
                 "params load_state_dict"      ``module.load_state_dict`` into an ``nn.Module``
                                               holding them (as parameters, or buffers where held as
                                               tensors)
                 "params replaced"             the old weight objects freed and new ones built the
                                               same way over the same memory, so the new weight has
                                               the dead one's ``id()`` (CPython reuses a freed
                                               object's) and address (as a caching allocator hands
                                               a freed block back) and the same ``_version``
               The call checked is always held to the oracle of the case's values
    held       how the parameters are held: "tensor" (plain tensors), "Parameter"
               (``nn.Parameter``, requires_grad where ``requires`` asks for their gradient, else
               False: a frozen or served model), "trainable Parameter" (``nn.Parameter`` with
               requires_grad=True whatever ``requires`` says: a trainable model evaluated; their
               gradients are then asked for too)
    deterministic  ``torch.use_deterministic_algorithms`` during the call and its backward: "off",
               "on" (as transformers' ``full_determinism``, Lightning's ``deterministic=True`` and
               reproducibility recipes set it; with ``warn_only=True``: what is drawn is the
               kernel's own path under the flag, ``torch.are_deterministic_algorithms_enabled()``,
               and torch's ops' deterministic implementations and NaN-filled ``torch.empty``,
               not whether each op it calls has a deterministic implementation)

The process-wide settings of torch drawn are the default dtype (``dtype``), deterministic
algorithms (``deterministic``) and the intra-op thread count (``threads``); grad mode and autocast,
per thread, are ``grad`` and ``autocast``.  The others are not drawn, each for a reason:
``torch.set_float32_matmul_precision`` / the TF32 and reduced-precision-reduction flags of
``torch.backends`` lower the precision of the matmuls a kernel calls at the user's request (a
result the error model does not claim: a kernel would be rejected for the user's choice);
``torch.set_flush_denormal`` does the same to subnormals (the sandbox fails a kernel that sets it);
``torch.set_num_interop_threads`` may be set once per process, before any inter-op work (drawing
it would fail the run, not the kernel); ``torch.set_default_device`` moves only the tensors a
kernel makes without a device, which land where the case is (CPU) or fail loudly (a CPU tensor
beside CUDA inputs), a path that changes no value silently; the CPU's vector capability
(``ATEN_CPU_CAPABILITY``) is read once at start-up; ``torch.backends.cudnn.benchmark`` /
``.deterministic`` choose among cuDNN convolution algorithms, which no op here calls, and
``torch.backends.mkldnn`` / ``opt_einsum`` among torch's own implementations of one float32 op;
the RNG is the sandbox's to restore.
The sandbox (``harness.sandbox``) saves and restores every drawn switch around each call and fails
a kernel that leaves one changed.

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
POOL = ("run", "1", "2", "3")
DY = ("contiguous", "transposed", "sliced", "expanded")
STATES = ("fresh", "x rewritten", "params rewritten", "params .data.copy_", "params copy_ under no_grad",
          "params load_state_dict", "params replaced")
HELD = ("tensor", "Parameter", "trainable Parameter")
DETERMINISTIC = ("off", "on")


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
    held: str = "tensor"
    deterministic: str = "off"

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
thread count as the run left it, parameters as plain tensors, deterministic algorithms off."""

LATER = {"autocast": "off", "threads": "run", "held": "tensor", "deterministic": "off"}
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
    if name == "held" and training:
        return HELD[:2]  # in a training step requires says which parameters are trainable
    return {"grad": GRAD, "dtype": DTYPES, "thread": THREADS, "dy": DY, "state": STATES, "autocast": AUTOCAST,
            "threads": POOL, "held": HELD, "deterministic": DETERMINISTIC}[name]


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


STRESSED = {"state": {"params .data.copy_": 3, "params replaced": 3}}
"""Values a random search lists this many times as often as a field's other values (``contexts``).
A kernel can tell three kinds of parameter write apart: ``_version`` moved ("params rewritten",
"params copy_ under no_grad", "params load_state_dict"), ``_version`` still ("params .data.copy_"),
a new object ("params replaced"); each kind is drawn as often as the others."""


def stored(value: dict) -> dict:
    """A replay file's context with each absent field of ``LATER`` as tested."""
    return {**LATER, **value}


@st.composite
def contexts(draw, leaves: tuple[str, ...], tested: Context, drawn: tuple[str, ...], bucket: Bucket | None = None,
             training: bool = False):
    """A ``Context``: each field in ``drawn`` sampled with ``tested``'s value first, the others
    ``tested``'s; ``training`` as ``choices`` takes it.  In a random search each other value is
    listed ``AWAY`` times (a field of k values keeps its as-tested one with probability
    1 / (AWAY (k - 1) + 1)), a ``STRESSED`` one that many times more (appended: a counterexample
    still shrinks towards the first, then in ``choices`` order); under a bucket each value once, the
    next in turn (``buckets.cycled``)."""
    values = {}
    for name in drawn:
        options = choices(name, leaves, training)
        first = getattr(tested, name)
        others = tuple(o for o in options if o != first) if first in options else options[1:]
        first = first if first in options else options[0]
        stressed = tuple(o for o in others for _ in range(AWAY * (STRESSED.get(name, {}).get(o, 1) - 1)))
        values[name] = draw(cycled((first,) + others, bucket, f"context {name}") if bucket is not None
                            else st.sampled_from((first,) + others * AWAY + stressed))
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
