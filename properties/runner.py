"""Running one property over one kernel and dtype with Hypothesis, and its ``Result``.

``run`` drives one property for one (implementation, dtype): it draws cases,
calls the property's check, keeps the worst error seen (and steers Hypothesis
towards it with ``target``), and on failure re-raises with the shrunk case,
the property, the dtype and the replay command.  Every run leaves a
``Result`` in its session's ``results`` for the certificate; it starts as ``error``
and becomes ``pass`` only when the search completed with every case checked.

What a kernel supports is its declared domain (``impls.domain``): cases are
drawn inside it (``fitting``), a dtype outside it is ``not-supported`` without a
call, and ``NotImplementedError`` on any case inside it is a failure.  A kernel
that declares no domain may still refuse a whole dtype: it raises
NotImplementedError on the op's small sample (``probes.probe``), and then on every
case drawn for that dtype (accepting one is a failure: support is not decided
by one fixed input); refusing some cases of a dtype it accepts is a failure
that says to declare the domain.

Everything here takes the run's ``Session`` (settings, results, hung kernels)
as its first argument; the module holds no run state.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis.errors import Flaky

from normcert import oracle
from normcert.oracle.formats import DTYPE_NAMES

from .case import Case
from .families import BY_NAME
from .fitting import fit
from .measure import PropertyFailure, Worst
from .probes import accepts_weightless, has_backward, probe, runs_interpreted
from .replay import save_failure
from .sandbox import NotSupported, first_line, invoke


@dataclass
class Result:
    impl: str
    op: str
    backend: str
    prop: str
    dtype: str
    outcome: str  # error (until the check completes) | pass | fail | not-supported | not-certified |
    #               expected-fail | warn
    examples: int = 0
    refused: int = 0  # drawn cases the kernel refused with NotImplementedError
    domain: str = ""  # what the checked (not refused) cases covered
    seconds: float = 0.0
    worst_units: float = 0.0
    worst_ulps: float = 0.0
    worst_where: str = ""
    unclaimed: int = 0
    message: str = ""
    replay: str = ""



def backward_gate(session, family, impl, dtype) -> None:
    """Before a family that checks the backward: a kernel registered without one skips; a
    kernel whose outputs carry no grad_fn is not certified by the family (forward only), and
    fails it where it was registered with a backward or under --require-backward.  Forward-only
    status, like support, is not decided by the op's sample alone: the gradients family's own
    cases (the same seeds) must carry no grad_fn either (``_no_grad_fn``), else the kernel fails."""
    import pytest  # noqa: PLC0415

    if impl.backward is False:
        pytest.skip(f"{impl.id} is registered without backward")
    # a calling convention (@inplace, @out, @outkw) is an inference one: a kernel called so is
    # forward only unless a backward is asked for (its copy_ into the buffers may record a partial graph)
    by_convention = bool(impl.convention) and not (impl.backward or session.require_backward)
    if not by_convention and has_backward(session, impl, dtype):
        return
    why = "registered with backward" if impl.backward else "--require-backward" if session.require_backward else ""
    if why:
        res = Result(impl.id, impl.op, impl.backend, family.name, DTYPE_NAMES[dtype], "fail",
                     message=f"{why}, but its outputs carry no grad_fn")
        session.results.append(res)
        pytest.fail(f"{family.name} fails for {impl.id} in {res.dtype}: {res.message}", pytrace=False)
    if by_convention:
        reason = f"@{impl.convention} is an inference calling convention"
        res = Result(impl.id, impl.op, impl.backend, family.name, DTYPE_NAMES[dtype], "not-certified")
        session.results.append(res)
    else:
        reason = "its outputs carry no grad_fn"
        gradients = BY_NAME["gradients"]
        try:
            res = run(session, family.name, impl, dtype, gradients.strategy(impl.op, dtype, session.device),
                      _no_grad_fn)
        except PropertyFailure as e:
            pytest.fail(str(e), pytrace=False)
        if res.outcome == "not-supported":
            pytest.skip(f"not-supported: {impl.id} {res.message}")
        res.outcome = "not-certified"
    res.message = f"forward only: {reason}, so its backward was not checked"
    pytest.skip(f"not-certified (forward only): {impl.id}: {reason}; --require-backward makes this a failure")


def _no_grad_fn(session, impl, case, worst):
    """A forward-only kernel's outputs carry no grad_fn on this case either (inputs requiring grad)."""
    live = case.replace(**{k: case.tensors[k].detach().clone().requires_grad_(True)
                           for k in case.record.grads_in(case.tensors)})
    with torch.enable_grad():
        outs = invoke(session, impl, live)
    carrying = [name for name, o in zip(case.record.outputs, outs) if o.grad_fn is not None]
    if carrying:
        raise PropertyFailure(f"{', '.join(carrying)} carries a grad_fn on this case but none on the op's sample "
                              f"(2 rows): forward-only must hold on every case, or its backward goes unchecked")


class Coverage:
    """What the checked cases covered (or, for a dtype the kernel does not support, refused)."""

    def __init__(self):
        self.examples = self.refused = self.rows = self.width = self.numel = 0
        self.layouts: set[str] = set()
        self.buckets: list[str] = []
        self.batch_sizes: set[int] = set()
        self.weightless = ""  # where the op has an optional weight / bias: "taken", or "filled" (ones for None)
        self.nones = 0  # cases checked with an optional weight or bias given as None

    def checked(self, case: Case) -> None:
        main = case.main
        width = main.shape[-1] if main.dim() else 1
        self.rows = max(self.rows, main.numel() // max(width, 1))
        self.width = max(self.width, width)
        self.numel = max(self.numel, main.numel())
        self.layouts.add("contiguous" if main.is_contiguous() else "strided")
        self.nones += any(case.tensors.get(k) is None for k in case.record.optional)
        if "bucket" in case.notes:
            self.buckets.append(case.notes["bucket"])
        if "batch sizes" in case.notes:
            self.batch_sizes.update(int(s) for s in case.notes["batch sizes"].split("/"))

    def refuse(self) -> None:
        self.refused += 1

    @property
    def domain(self) -> str:
        if not self.layouts:  # no case checked
            return f"nothing checked: refused {self.refused} of {self.examples} cases" if self.refused \
                else "nothing checked"
        text = (f"rows <= {self.rows}, row length <= {self.width}, largest call {self.numel} elements, "
                f"layouts: {'/'.join(sorted(self.layouts))}")
        if self.buckets:
            text += f"; buckets: {', '.join(self.buckets)}"
        if self.batch_sizes:
            text += f"; batch sizes: {', '.join(map(str, sorted(self.batch_sizes)))}"
        if self.weightless == "taken":
            text += f"; weightless calls (None weight / bias): {self.nones} cases"
        elif self.weightless == "filled":
            text += "; weightless calls not accepted (raised on None): None given as ones / zeros"
        return text


def scheduled(session, family, impl, dtype) -> tuple:
    """The family's buckets (``strategies.buckets``) for this kernel and dtype, spun by the run's seed.
    The "million" bucket (one call past 2**20 elements) is scheduled in one dtype of the kernel's
    domain per run, rotating with the seed: a call that size costs seconds under Triton's interpreter."""
    from .strategies import buckets, large_buckets  # noqa: PLC0415

    if not family.buckets or not family.applies(oracle.OPS[impl.op]) or not impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
        return ()
    spin = session.derive_seed(impl.op, family.name, DTYPE_NAMES[dtype], "buckets")
    if family.profile == "large":
        return large_buckets(oracle.OPS[impl.op], spin)
    interpreted = "many" in family.buckets and runs_interpreted(session, impl, dtype)
    admitted = [d for d in DTYPE_NAMES.values() if impl.domain.admits_dtype(d)]
    million = admitted[session.derive_seed(impl.op, family.name, "million") % len(admitted)]
    return tuple(b for b in buckets(oracle.OPS[impl.op], spin, interpreted) if b.name in family.buckets
                 and (b.name != "million" or million == DTYPE_NAMES[dtype]))


def run_family(session, family, impl, dtype, *, max_examples=None, gating=True) -> Result:
    """``run`` of a property family (``families.Family``): its random search (none for a family
    of a profile), then its buckets."""
    schedule = [(b.label, family.strategy(impl.op, dtype, session.device, bucket=b))
                for b in scheduled(session, family, impl, dtype)]
    search = None if family.profile else family.strategy(impl.op, dtype, session.device)
    return run(session, family.name, impl, dtype, search, family.check_fn(), max_examples=max_examples,
               gating=gating, buckets=schedule)


_NO_SHRINK = tuple(p for p in Phase if p not in (Phase.shrink, Phase.explain))


def run(session, prop: str, impl, dtype, strategy, check, *, max_examples=None, gating=True, buckets=()) -> Result:
    """Run ``check(session, impl, case, worst)`` over ``strategy`` (``max_examples`` cases, default:
    the profile's; None: no random search), then over each (label, strategy) of ``buckets`` (one
    case each: the first one Hypothesis tries, not shrunk); record and raise on failure.  A
    non-gating run (a bitwise family without --bitwise) reports a failure as a warning and does
    not shrink it: shrinking re-runs the kernel hundreds of times for a case that fails nothing;
    nor is a case study's expected failure shrunk, outside ``--profile thorough``."""
    outside = outside_domain(session, impl, prop, dtype)
    if outside:
        return outside
    res = Result(impl.id, impl.op, impl.backend, prop, DTYPE_NAMES[dtype], "error")
    session.results.append(res)
    domain = impl.domain
    supported = probe(session, impl, dtype)
    if not supported and domain.declared:
        res.outcome = "fail"
        res.message = f"refused the op's sample (2 rows) inside its declared domain ({domain.describe()})"
        raise PropertyFailure(f"{prop} fails for {impl.id} ({impl.backend}) in {res.dtype}: {res.message}")
    if not supported:  # the whole dtype refused: every case must be refused too
        check = _refuses(res.dtype)
    # a failure is shrunk to a small case, at the price of re-running kernel and oracle hundreds of
    # times; not where the failure decides nothing (a bitwise family without --bitwise) or is the
    # expected verdict on a case study (most of the suite's time went to shrinking those), unless
    # --profile thorough asks for their minimal cases
    shrinks_not = ("a warning" if not gating else
                   "a case study, expected to fail; --profile thorough shrinks it"
                   if impl.expected_failure and session.profile != "thorough" else "")
    shrinks = not shrinks_not
    worst = Worst()
    cover = Coverage()
    state = {}
    in_domain = functools.partial(fit, domain=domain)
    if oracle.OPS[impl.op].optional:  # a dtype refused on the sample: whether None is taken is unknown
        taken = domain.weightless if domain.weightless is not None else \
            supported and accepts_weightless(session, impl, dtype)
        cover.weightless = "taken" if taken else "filled"
        if not taken:
            in_domain = lambda case: fit(case, domain).with_identity()  # noqa: E731
    strategy = None if strategy is None else strategy.map(in_domain)
    buckets = [(label, strat.map(in_domain)) for label, strat in buckets]

    overrides = {"suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
                 # too_slow: an 8192-wide row through the Triton interpreter is slow by design;
                 # data_too_large: the case strategy draws many structural choices on purpose.
                 "deadline": None, "report_multiple_bugs": False}

    def search(strat, examples, *seed_parts, **more):
        @seed(session.derive_seed(impl.op, prop, DTYPE_NAMES[dtype], *seed_parts))
        @settings(**overrides, **more, **({} if examples is None else {"max_examples": examples}))
        @given(case=strat)
        def body(case):
            cover.examples += 1
            worst.example_units = 0.0
            try:
                check(session, impl, case, worst)
            except NotSupported as e:
                if not supported:
                    cover.refuse()
                    return
                state["failed"] = (case, _refusal(domain, e))
                raise PropertyFailure(state["failed"][1]) from None
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                state["failed"] = (case, first_line(e) or type(e).__name__)
                raise
            finally:
                target(min(worst.example_units, 1e6), label="error / bound")
            cover.checked(case)

        body()

    t0 = time.perf_counter()
    try:
        if strategy is not None:
            search(strategy, max_examples, **({} if shrinks else {"phases": _NO_SHRINK}))
        for label, strat in buckets:
            # no shrinking: the bucket fixes the shape, and each step would re-run a large case
            search(strat, 1, label, phases=(Phase.generate,))
        res.outcome = "pass" if supported else "not-supported"
        if not supported:
            res.message = f"raises NotImplementedError for {res.dtype}: on the op's sample and all {cover.examples} cases"
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - AssertionError is a failure; anything else an error
        # Flaky: a case failed, then passed or failed otherwise when Hypothesis ran it
        # again -- the kernel's answer changes from call to call, itself a failure
        failure = isinstance(e, (AssertionError, Flaky))
        res.outcome = ("fail" if gating else "warn") if failure else "error"
        case, res.message = state.get("failed") or (None, first_line(e) or type(e).__name__)
        if isinstance(e, Flaky):
            res.message = f"nondeterministic: the same case gave another result when run again ({res.message})"
        elif not failure:
            res.message = f"{type(e).__name__} while checking: {res.message}"
        if case is not None:
            res.worst_where = case.describe()
            res.replay = save_failure(impl, prop, case, session.failures_dir)
        if gating or not failure:
            raise PropertyFailure(
                f"{prop} fails for {impl.id} ({impl.backend}) in {DTYPE_NAMES[dtype]}: {res.message}\n"
                f"  {'shrunk case' if shrinks else 'first failing case (not shrunk: ' + shrinks_not + ')'}: "
                f"{res.worst_where}\n  replay: {res.replay}"
            ) from None
    finally:
        res.seconds = time.perf_counter() - t0
        res.examples, res.refused, res.domain = cover.examples, cover.refused, cover.domain
        if worst.checked:
            res.domain += (f"; quantised outputs bit-exact (the exactly rounded value): "
                           f"{worst.exact} of {worst.checked} ({100 * worst.exact / worst.checked:.2f}%)")
        res.worst_units, res.worst_ulps, res.unclaimed = worst.units, worst.ulps, worst.unclaimed
        if res.outcome == "pass":
            res.worst_where = worst.where
    return res


def outside_domain(session, impl, prop: str, dtype) -> Result | None:
    """A ``not-supported`` result, recorded, where ``dtype`` is outside the kernel's declared domain
    (the kernel is not called); None inside it."""
    if impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
        return None
    res = Result(impl.id, impl.op, impl.backend, prop, DTYPE_NAMES[dtype], "not-supported",
                 message=f"outside its declared domain ({impl.domain.describe()})")
    session.results.append(res)
    return res


def _refusal(domain, e: NotSupported) -> str:
    if domain.declared:
        return f"refused a case inside its declared domain ({domain.describe()}): {e.why}"
    return (f"refused a case of a dtype it accepts: {e.why}; a kernel that supports part of the op declares "
            f"its domain (normcert_domain on the kernel, or --domain), and is certified on it")


def _refuses(dtype_name: str):
    """The check for a dtype whose sample the kernel refused: it must refuse every case."""
    def check(session, impl, case, worst):
        invoke(session, impl, case)  # NotSupported: consistent
        raise PropertyFailure(f"refused the op's sample in {dtype_name} (NotImplementedError) but accepted this "
                              f"case: support must hold for the whole dtype, or be declared (normcert_domain)")
    return check


def certify(session, family, impl, dtype) -> Result:
    """``run`` of a property family (``families.Family``) as a pytest test: not-supported
    skips, a case study's failure is expected, a bitwise family gates only under --bitwise."""
    import warnings  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    prop = family.name
    if family.backward:
        backward_gate(session, family, impl, dtype)
    gating = session.bitwise if family.bitwise else True
    try:
        res = run_family(session, family, impl, dtype, gating=gating)
    except PropertyFailure as e:
        if impl.expected_failure:
            session.results[-1].outcome = "expected-fail"
            pytest.xfail(f"{impl.expected_failure} | {e}")
        pytest.fail(str(e), pytrace=False)  # the message is the report; the suite's frames are noise
    if res.outcome == "not-supported":
        pytest.skip(f"not-supported: {impl.id} {res.message}")
    if res.outcome == "warn":
        warnings.warn(f"{prop} (not gating without --bitwise): {impl.id} in {res.dtype}: {res.message}", stacklevel=2)
    return res
