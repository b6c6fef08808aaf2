"""Running one property over one kernel and dtype with Hypothesis, and its ``Result``.

``run`` drives one property for one (implementation, dtype): it draws cases,
calls the property's check, keeps the worst error seen (and steers Hypothesis
towards it with ``target``), and on failure re-raises with the failing case
reduced (``reduce``: Hypothesis's own shrinking is not run, the reducer costs far
fewer kernel calls), the property, the dtype and the replay command.  Every run leaves one
``Result`` in its session's ``results`` for the certificate, made once at its end
(``record``): ``pass`` only when the search completed with every case checked and
some case held an element (``not-run`` where none did: nothing checked is no evidence),
``error`` where it stopped otherwise: an exception in normcert's own checking code
(everything the kernel raises is a ``ContractViolation`` or a refusal by then,
``sandbox.kernel_code``), reported as normcert's, not the kernel's (``harness_error``).
``forward_only`` and ``gradcheck`` are the backward families' own runs.

What a kernel supports is its declared domain (``properties.declared.domain``): cases are
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
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from ... import oracle
from ...oracle.formats import DTYPE_NAMES

from ..search.case import Case
from ..families.compiled import MODES as COMPILED_MODES
from ..families.served import modes_ran
from ..families.gradcheck import finite_differences, gradcheck_case, which_side
from ..families.gradients import fresh_leaves
from ..families import BY_NAME, examples
from ..search.fitting import fit
from ..harness.measure import PropertyFailure, Worst
from ..search.constants import own_constants_only
from ..search.context import ran, tally
from ..search.modes import AS_TESTED
from ..harness.probes import accepts_weightless, first_call, has_backward, inference_convention, probe, sample
from ..evidence.replay import save_failure
from ..harness.calling import effective
from ..harness import launches
from ..harness.sandbox import ContractViolation, KernelHung, NotSupported, first_line, invoke, kernel_code
from ..families.long_run import said
from .failures import kind_of
from .reduce import reduce
from .news import say
from .schedule import scheduled


@dataclass
class Result:
    impl: str
    op: str
    backend: str
    prop: str
    dtype: str
    outcome: str  # error (until the check completes) | pass | fail | not-supported | not-certified |
    #               expected-fail | warn | not-run (its cases held 0 elements)
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
    modes: str = AS_TESTED  # how the kernel was called (``modes``): the served family lists its modes, a
    #                         family that draws the calling context its counts (``context.ran``)
    threads: int = 0  # torch's intra-op threads when recorded; a failing served row: those of the call that failed
    calls: int = 0  # the calls in a row of the served family's long run (``families.long_run``); 0: none
    launches: dict = field(default_factory=dict)  # its Triton launches (``harness.launches.take``)
    failures: list = field(default_factory=list)  # each distinct failure the search found (``Found.entry``):
    #                                               the first is the one message, worst_where and replay name


NO_GRAD_FN = "its outputs carry no grad_fn"


def forward_only(session, family, impl, dtype) -> Result | None:
    """Before a family that checks the backward (of a kernel not registered without one): None
    where the kernel's outputs carry a grad_fn, else the family's recorded result: not-certified
    (forward only), or fail where the kernel was registered with a backward or under
    --require-backward.  Forward-only status, like support, is not decided by the op's sample
    alone: the gradients family's own cases (the same seeds) must carry no grad_fn either
    (``no_grad_fn``; PropertyFailure where one does; not-supported where the dtype is refused)."""
    convention = inference_convention(session, impl)
    if not convention and has_backward(session, impl, dtype):
        return None
    why = "registered with backward" if impl.backward else "--require-backward" if session.require_backward else ""
    if why:
        return record(session, impl, family.name, DTYPE_NAMES[dtype], "fail",
                      message=f"{why}, but its outputs carry no grad_fn")
    message = f"forward only: {convention or NO_GRAD_FN}, so its backward was not checked"
    if convention:
        return record(session, impl, family.name, DTYPE_NAMES[dtype], "not-certified", message=message)
    gradients = BY_NAME["gradients"]
    return run(session, family.name, impl, dtype, gradients.cases(impl.op, dtype, session.device), no_grad_fn,
               judge=lambda outcome, said: ("not-certified", message) if outcome == "pass" else (outcome, said))


def gradcheck(session, impl) -> Result:
    """torch's gradcheck test of the kernel in float64 on the op's small sample
    (``families.gradcheck.finite_differences``), recorded: pass, fail (expected-fail for a case
    study), not-supported (NotImplementedError), or error where the check itself raised."""
    case = fit(gradcheck_case(impl.op, session.device), impl.domain)
    live, leaves = fresh_leaves(case)
    names = list(leaves)

    def fn(*tensors):
        c = case.replace(**dict(zip(names, tensors)))
        return c.record.call(impl.fn, c.oracle_args())

    outcome, message = "error", ""
    forcing = session.forcing(impl)
    try:
        for config in forcing.names or ("",):  # an autotuned kernel: under each of its configs
            forcing.select(config)
            mismatch = kernel_code(session, impl, " (gradcheck)",
                                   lambda: finite_differences(fn, [leaves[k] for k in names]), torch.float64)
            outcome = "pass" if mismatch is None else "fail"
            message = "" if mismatch is None else (f"gradcheck fails for {impl.id} in float64 on "
                                                   f"{case.under(config).describe()}: {which_side(case, names, mismatch)}")
            if mismatch is not None:
                break
    except NotSupported:
        outcome = "not-supported"
    except ContractViolation as e:
        outcome, message = "fail", str(e)
    finally:
        forcing.select("")
        if outcome == "fail" and impl.expected_failure:
            outcome = "expected-fail"
        res = record(session, impl, "gradcheck", "float64", outcome, message=message, examples=1)
    return res


def no_grad_fn(session, impl, case, worst):
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
        self.configs: list[str] = []  # an autotuned kernel's configs the cases ran under
        self.batch_sizes: set[int] = set()
        self.batch_scaled = ""  # how the batch sizes were scaled (Triton's interpreter), if they were
        self.weightless = ""  # where the op has an optional weight / bias: "taken", or "filled" (ones for None)
        self.nones = 0  # cases checked with an optional weight or bias given as None
        self.contexts: dict[str, dict[str, int]] = {}  # the calling contexts of the checked cases (``context.tally``)

    def checked(self, case: Case) -> None:
        main = case.main
        width = main.shape[-1] if main.dim() else 1
        self.rows = max(self.rows, main.numel() // max(width, 1))
        self.width = max(self.width, width)
        self.numel = max(self.numel, main.numel())
        self.layouts.add("contiguous" if main.is_contiguous() else "strided")
        self.nones += any(case.tensors.get(k) is None for k in case.record.optional)
        if "bucket" in case.notes:  # a bucket fitted into the declared domain is named as such: its shape changed
            bucket = case.notes["bucket"] + (" (fitted to the domain)" if case.notes.get("fitted") else "")
            if bucket not in self.buckets:
                self.buckets.append(bucket)
        if case.config and case.config not in self.configs:
            self.configs.append(case.config)
        if "batch sizes" in case.notes:
            self.batch_sizes.update(int(s) for s in case.notes["batch sizes"].split("/"))
            self.batch_scaled = case.notes.get("batch sizes scaled", self.batch_scaled)

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
            text += f"; batch sizes: {', '.join(map(str, sorted(self.batch_sizes)))}" \
                + (f" ({self.batch_scaled})" if self.batch_scaled else "")
        if self.configs:
            text += f"; autotuned configs: {' | '.join(self.configs)}"
        if self.weightless == "taken":
            text += f"; weightless calls (None weight / bias): {self.nones} cases"
        elif self.weightless == "filled":
            text += "; weightless calls not accepted (raised on None): None given as ones / zeros"
        return text


def as_run(outcome: str, message: str) -> tuple[str, str]:
    """``run``'s default ``judge``: the outcome is the run's own."""
    return outcome, message


def run_family(session, family, impl, dtype, *, max_examples=None, gating=True, judge=as_run,
               shrink=True) -> Result:
    """``run`` of a property family (``families.Family``): its random search (none for a family
    of a profile), then its buckets."""
    schedule = [(b.label, family.cases(impl.op, dtype, session.device, bucket=b))
                for b in scheduled(session, family, impl, dtype)]
    search = None if family.profile else family.cases(impl.op, dtype, session.device)
    if max_examples is None and family.divide > 1:
        max_examples = examples(family, settings().max_examples)
    return run(session, family.name, impl, dtype, search, family.check, max_examples=max_examples,
               gating=gating, buckets=schedule, judge=judge, shrink=shrink)


_NO_SHRINK = tuple(p for p in Phase if p not in (Phase.shrink, Phase.explain))  # a failure is reduced by ``reduce``
_OVERRIDES = {"suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
              # too_slow: an 8192-wide row through the Triton interpreter is slow by design;
              # data_too_large: the case strategy draws many structural choices on purpose.
              "deadline": None, "report_multiple_bugs": False,
              # every run's search is the same inner function to Hypothesis, so a shared example
              # database would replay one run's failures into another (results then depend on test
              # order and the xdist split); runs are seeded, and failures are kept as replay files
              "database": None}
FAILED = ("fail", "error", "expected-fail", "not-run")  # the outcomes ``run`` raises PropertyFailure for


def record(session, impl, prop: str, dtype: str, outcome: str, **fields) -> Result:
    """The one place a ``Result`` is made: the final result of ``prop`` on ``impl`` in ``dtype``
    (a name), kept in the session's results for the certificate.  It ends the result's watch of
    the kernel (``sandbox.kernel_code``): a hang fails this result only, and the slowest call
    allowed since the last result (``session.slow``) is said in its message."""
    session.hung.pop(impl.id, None)
    slow = session.slow.pop(impl.id, (0.0, ""))[1]
    if slow:
        fields["message"] = f"{fields['message']}; {slow}" if fields.get("message") else slow
    if prop == "served":
        ran = session.long_runs.pop(impl.id, None)
        fields.setdefault("calls", ran.calls if ran else 0)
        fields.setdefault("modes", f"{modes_ran(session, impl, getattr(torch, dtype))}; {said(ran)}")
    elif prop == "compiled":
        fields.setdefault("modes", COMPILED_MODES)
    fields.setdefault("threads", torch.get_num_threads())
    fields.setdefault("launches", launches.take())  # the Triton launches since the last result: this check's
    res = Result(impl.id, impl.op, impl.backend, prop, dtype, outcome, **fields)
    session.results.append(res)
    return res


def run(session, prop: str, impl, dtype, strategy, check, *, max_examples=None, gating=True, buckets=(),
        judge=as_run, shrink=True) -> Result:
    """Run ``check(session, impl, case, worst)`` over ``strategy`` (``max_examples`` cases, default:
    the profile's; None: no random search), then over each (label, strategy) of ``buckets`` (one
    case each: the first one Hypothesis tries); record the result and raise on failure.  A failing
    case, drawn or a bucket's, is reduced (``reduce``) to a small one that fails the same way.
    A non-gating run (a bitwise family without --bitwise) reports a failure as a warning and does
    not reduce it: reducing re-runs the kernel tens of times for a case that fails nothing;
    nor is a case study's expected failure shrunk, outside ``--profile thorough``; ``shrink=False``
    asks for none (the meta-tests' detection checks: whether a bug dies, not its minimal case).
    ``judge(outcome, message)`` reads the run's own outcome (pass, fail, warn, error,
    not-supported) as the caller's verdict before it is recorded (a case study's failure is
    expected-fail); an outcome in ``FAILED`` raises PropertyFailure."""
    outside = outside_domain(session, impl, prop, dtype)
    if outside:
        return outside
    supported = probe(session, impl, dtype)
    wrong = first_call(session, impl, dtype)  # said after the search, where the search finds nothing worse
    if not supported and impl.declares:
        chosen = "".join(f", {k}={v!r}" for k, v in sample(session, impl, dtype).scalars.items()
                         if isinstance(v, (str, bool)))
        message = (f"refused the op's sample (2 rows{chosen}) inside its declared domain "
                   f"({impl.domain.describe() or 'all'})")
        outcome, message = judge("fail", message)
        res = record(session, impl, prop, DTYPE_NAMES[dtype], outcome, message=message)
        raise PropertyFailure(f"{prop} fails for {impl.id} ({impl.backend}) in {res.dtype}: {res.message}")
    search = _Search(session, prop, impl, dtype, check, supported, gating, shrink)
    strategy, buckets = search.in_domain(strategy, buckets)
    t0 = time.perf_counter()
    outcome, message, failed = "error", "", None
    try:
        search.all(strategy, max_examples, buckets)
        outcome, message = search.completed()
        if wrong:  # the first run to see a wrong first call of the dtype in this process: it counts, gating always
            outcome, message = "fail", (f"its first call in {DTYPE_NAMES[dtype]} in this process (on the op's "
                                        f"2 x 4 sample, the support probe) was wrong: {wrong}")
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - AssertionError is a failure; anything else an error
        outcome, message, failed = search.failure(e)
        search.others(e, outcome, message, strategy, max_examples, buckets, time.perf_counter() - t0)
    finally:
        res = search.conclude(outcome, message, failed, time.perf_counter() - t0, judge)
    if res.outcome == "not-run":
        raise PropertyFailure(f"{prop} checked nothing for {impl.id} ({impl.backend}) in {res.dtype}: {res.message}")
    if res.outcome in FAILED:
        raise PropertyFailure(
            f"{prop} {'could not be checked' if res.outcome == 'error' else 'fails'} for {impl.id} ({impl.backend}) "
            f"in {res.dtype}: {res.message}\n"
            f"  {search.found[0].label if search.found else search._label()}: {res.worst_where}\n  replay: {res.replay}"
            + "".join(f"\n  and a failure of another kind: {f['message']}\n    {found.label}: {f['where']}\n"
                      f"    replay: {f['replay']}" for f, found in zip(res.failures[1:], search.found[1:]))
        ) from None
    return res


MOST_FAILURES = 3
"""The most distinct failures a cell's search reports in a run of the plugin (``_Search.others``;
``Session.most_failures``, which a meta-test's own session leaves at 1: it asks whether a bug dies)."""

MORE_TIME = 2.0
MORE_TIME_FLOOR = 0.5
"""The search for failures of other kinds may take ``MORE_TIME`` times what the first failure took
(its search and reduction), or ``MORE_TIME_FLOOR`` seconds where that is more: a failing cell costs
at most about three times what it did when the search stopped at its first failure."""


class _OutOfBudget(BaseException):
    """Raised in a search for failures of another kind once its time is spent: a BaseException, so
    Hypothesis stops at once instead of taking it for a failure and shrinking it."""


@dataclass
class Found:
    """One distinct failure of a cell: the (shrunk) case, its message, and its kind (``kind_of``);
    ``units`` and ``ulps``: the failing measurement's error / bound and ulps, where one was made."""

    case: Case
    message: str
    kind: str
    units: float | None = None
    ulps: float | None = None
    label: str = "failing case"  # how the case is named where it is reported (``_Search._label``)

    def entry(self, replay: str) -> dict:
        """The certificate's entry for it (``Result.failures``), ``replay`` the command that replays it."""
        measured = {} if self.units is None else {"worst_units": self.units, "worst_ulps": self.ulps}
        return {"message": self.message, "where": self.case.describe(), "kind": self.kind, "replay": replay,
                **measured}


class _Search:
    """One ``run``'s Hypothesis searches and what they found: the worst error, the coverage, and
    the case that failed with its message; after a failure, the failures of other kinds (``others``)."""

    def __init__(self, session, prop, impl, dtype, check, supported: bool, gating: bool, shrink: bool = True):
        self.session, self.prop, self.impl, self.dtype = session, prop, impl, dtype
        self.supported, self.gating = supported, gating
        # the whole dtype refused: every case must be refused too
        self.check = check if supported else _refuses(DTYPE_NAMES[dtype])
        # a failure is reduced to a small case (``reduce``), at the price of re-running kernel and oracle
        # up to ``reduce.BUDGET`` times; not where the failure decides nothing (a bitwise family without --bitwise) or is the
        # expected verdict on a case study (most of the suite's time went to shrinking those), unless
        # --profile thorough asks for their minimal cases
        self.shrinks_not = ("a warning" if not gating else "not asked" if not shrink else
                            "a case study, expected to fail; --profile thorough shrinks it"
                            if impl.expected_failure and session.profile != "thorough" else "")
        self.worst = Worst()
        self.cover = Coverage()
        self.failed = None  # (case, message) of the case that failed
        self.failed_as: tuple = ("", None, None)  # ... and its (kind, units, ulps)
        self.found: list[Found] = []  # the distinct failures: the first, then those of other kinds (``others``)
        self.round = 0  # 0: the search; k: its k-th search for a failure of another kind
        self.ran: set[int] = set()  # the buckets run (by index): another round does not run one again
        self.until = None  # perf_counter() past which another round stops (``_OutOfBudget``)
        self.partial = None  # the last failing case of the round's new kind, held where its time runs out
        self.hung = None  # (case, message) of the case the kernel hung on (``sandbox.KernelHung``)
        self.reduction = None  # how the last failing case was reduced (``reduce.Reduction``), None: it was not
        self.forcing = session.forcing(impl)

    def in_domain(self, strategy, buckets):
        """The strategies with every case fitted into the kernel's declared domain, and None for the
        op's optional weight and bias replaced by the identity where the kernel does not take it."""
        domain = self.impl.domain
        fitted = functools.partial(fit, domain=domain)
        if oracle.OPS[self.impl.op].optional:  # a dtype refused on the sample: whether None is taken is unknown
            taken = domain.weightless if domain.weightless is not None else \
                self.supported and accepts_weightless(self.session, self.impl, self.dtype)
            self.cover.weightless = "taken" if taken else "filled"
            if not taken:
                fitted = lambda case: fit(case, domain).with_identity()  # noqa: E731
        return self.under_configs(None if strategy is None else strategy.map(fitted),
                                  [(label, strat.map(fitted)) for label, strat in buckets])

    def under_configs(self, strategy, buckets):
        """For an autotuned kernel, the strategies with each case under one of its configs
        (``properties.harness.autotune``): a random case under a drawn config (shrinking towards the first), each
        bucket's case under every config (the same case: its seed is the bucket's)."""
        names = self.forcing.names
        if not names:
            return strategy, buckets
        if strategy is not None:
            strategy = st.tuples(strategy, st.sampled_from(names)).map(lambda pair: pair[0].under(pair[1]))
        return strategy, [(label, strat.map(functools.partial(Case.under, config=name)))
                          for label, strat in buckets for name in names]

    def all(self, strategy, max_examples, buckets) -> None:
        """The random search (on another seed in each later round), then each bucket not run yet."""
        try:
            if strategy is not None:
                again = ("another kind", self.round) if self.round else ()
                self.search(strategy, max_examples, *again, phases=_NO_SHRINK)
            for k, (label, strat) in enumerate(buckets):
                if k in self.ran:
                    continue
                self.ran.add(k)
                # one case, the bucket's: a failure is reduced afterwards (``failure``), not by Hypothesis
                self.search(strat, 1, label, phases=(Phase.generate,))
        finally:
            self.forcing.select("")  # calls outside a search (the sample probes) run the first config

    def search(self, strat, examples, *seed_parts, **more) -> None:
        @seed(self.session.derive_seed(self.impl.op, self.prop, DTYPE_NAMES[self.dtype], *seed_parts))
        @settings(**_OVERRIDES, **more, **({} if examples is None else {"max_examples": examples}))
        @given(case=strat)
        def body(case):
            self.example(case)

        with own_constants_only():  # the seed's cases, whatever modules this process imported
            body()

    def example(self, case) -> None:
        """Check one case, keep its worst error (which Hypothesis climbs) and what it covered."""
        if self.until is not None and time.perf_counter() > self.until:
            raise _OutOfBudget
        self.cover.examples += 1
        self.worst.example_units = 0.0
        self.forcing.select(case.config)
        called_in = effective(self.impl, case)
        if called_in != case.context:  # the context the call runs in: what its worst_where, replay and modes name
            case = case.copy(context=called_in)
        try:
            self.check(self.session, self.impl, case, self.worst)
        except NotSupported as e:
            if not self.supported:
                self.cover.refuse()
                return
            if self._known(case, e, _refusal(self.impl, e), ran=False):
                return
            raise PropertyFailure(self.failed[1]) from None
        except KeyboardInterrupt:
            raise
        except KernelHung as e:  # the cases after a hang fail uncalled: the one to report is the one that hung
            self.failed = self.hung = self.hung or (case, first_line(e))
            self.failed_as = (kind_of(e, self.failed[1]), None, None)
            raise
        except BaseException as e:
            if self._known(case, e, (first_line(e) or type(e).__name__) + self.forcing.pruned_note()):
                return
            raise
        finally:
            target(min(self.worst.example_units, 1e6), label="error / bound")
        self.cover.checked(case)
        tally(self.cover.contexts, case.context)

    def _known(self, case, e: BaseException, message: str, ran: bool = True) -> bool:
        """Is ``e`` on ``case`` a failure of a kind found already (a later round passes over it: it
        seeks another kind, and its target no longer climbs this one)?  Else it is kept as the case
        that failed.  ``ran``: the kernel computed on the case (False: it refused it)."""
        if ran:  # the cell's coverage says what ran, failing or not; a refused case computed nothing
            self.cover.checked(case)
        kind = kind_of(e, message)
        if any(f.kind == kind for f in self.found):
            self.worst.example_units = 0.0
            return True
        if self.failed is None and not self.round and self.gating:  # the first counterexample, said now (news)
            say(f"{self.prop} fails for {self.impl.id} in {DTYPE_NAMES[self.dtype]} (a first case, shrunk next): {message}")
        self.failed = (case, message)
        self.failed_as = (kind, getattr(e, "units", None), getattr(e, "ulps", None))
        if self.round:
            self.partial = Found(case, message, *self.failed_as,
                                 label="first failing case (not shrunk: the time for other failures ran out)")
        return False

    def others(self, e: BaseException, outcome: str, message: str, strategy, max_examples, buckets,
               seconds: float) -> None:
        """After the search failed with ``e`` (its ``outcome`` and ``message``) in ``seconds``: search on for failures
        of other kinds (``kind_of``), as Hypothesis does when it reports several distinct bugs, each
        reduced: round after round, each a random search on a seed of its own (then the buckets not
        run yet), until ``session.most_failures`` are found or ``MORE_TIME`` runs out (a case found
        then is kept as found, not reduced), or, for a family with no random search, its buckets are done.  Not after a hang, a nondeterministic
        kernel, normcert's own error, or a failure not reduced (``shrinks_not``: it decides
        nothing or costs too much)."""
        if self.failed is None:
            return
        self.found = [Found(self.failed[0], message, *self.failed_as, label=self._label())]
        if outcome != "fail" or isinstance(e, Flaky) or self.hung or self.shrinks_not or self.session.most_failures < 2:
            return
        met = self.reduction.others if self.reduction is not None else []
        for case, said, again in met:  # met while reducing the first: reduced in turn, as a search's would be
            if len(self.found) >= self.session.most_failures:
                break
            self.failed, self.failed_as = (case, said), (kind_of(again, said), getattr(again, "units", None),
                                                         getattr(again, "ulps", None))
            outcome, said, case = self.failure(again)
            self.found.append(Found(case, said, *self.failed_as, label=self._label()))
        self.until = time.perf_counter() + max(MORE_TIME * seconds, MORE_TIME_FLOOR)
        kept = self.worst
        self.worst = Worst()  # the result's worst error stays the first search's
        try:
            while len(self.found) < self.session.most_failures:
                self.round += 1
                self.failed = self.partial = None
                try:
                    self.all(strategy, max_examples, buckets)
                    if strategy is None:
                        return  # every bucket ran: nothing else to draw
                    continue  # nothing new on this seed: another, while time is left
                except _OutOfBudget:
                    if self.partial is not None:
                        self.found.append(self.partial)
                    return
                except KeyboardInterrupt:
                    raise
                except BaseException as again:  # noqa: BLE001 - a failure of another kind, or an error
                    outcome, message, case = self.failure(again)
                    if case is None:
                        return
                    self.found.append(Found(case, message, *self.failed_as, label=self._label()))
                    if outcome != "fail" or isinstance(again, Flaky) or self.hung:
                        return
        finally:
            self.worst, self.until = kept, None

    def _label(self) -> str:
        """How the failing case is named: ``reduce.Reduction.label`` where it went through reduction,
        else the first failing case and why it was not reduced (a hang, a nondeterministic kernel,
        normcert's own error, or ``shrinks_not``)."""
        if self.reduction is not None:
            return self.reduction.label
        why = self.shrinks_not or ("the kernel hung on it" if self.hung else "not a reproducible failure")
        return f"first failing case (not shrunk: {why})"

    def completed(self) -> tuple[str, str]:
        """The outcome of a search that raised nothing: pass, where the cases it checked held elements;
        not-run where none did (every main tensor empty after fitting: the check ran on nothing, which
        is no evidence); not-supported where the dtype was refused throughout."""
        if self.supported and self.cover.numel == 0:
            return "not-run", (f"nothing checked: the {self.cover.examples} cases held 0 elements "
                               f"({self.cover.domain}; declared domain: {self.impl.domain.describe() or 'all'})")
        if self.supported:
            return "pass", ""
        return "not-supported", (f"raises NotImplementedError for {DTYPE_NAMES[self.dtype]}: on the op's sample "
                                 f"and all {self.cover.examples} cases")

    def failure(self, e: BaseException) -> tuple[str, str, object]:
        """(outcome, message, the failing case or None) of a search that raised ``e``."""
        # Flaky: a case failed, then passed or failed otherwise when Hypothesis ran it
        # again -- the kernel's answer changes from call to call, itself a failure
        failure = isinstance(e, (AssertionError, Flaky))
        outcome = ("fail" if self.gating else "warn") if failure else "error"
        case, message = self.failed or (None, first_line(e) or type(e).__name__)
        self.reduction = None
        if failure and case is not None and not self.shrinks_not and not isinstance(e, Flaky) and not self.hung:
            case, message, self.reduction = reduce(self, case, message, self.failed_as[0])
            self.failed = case, message
        if isinstance(e, Flaky):
            message = f"nondeterministic: the same case gave another result when run again ({message})"
        elif not failure:
            message = harness_error(e, message)
        return outcome, message, case

    def conclude(self, outcome: str, message: str, failed, seconds: float, judge) -> Result:
        """The run's result, judged and recorded; a failing case is saved as a replay file."""
        worst, cover, domain = self.worst, self.cover, self.cover.domain
        if worst.checked:
            domain += (f"; quantised outputs bit-exact (the exactly rounded value): "
                       f"{worst.exact} of {worst.checked} ({100 * worst.exact / worst.checked:.2f}%)")
        where, replay, failures = (worst.where if outcome == "pass" else ""), "", []
        if failed is not None:
            where, replay = failed.describe(), save_failure(self.impl, self.prop, failed, self.session.failures_dir)
            failures = [f.entry(replay if k == 0 else
                                save_failure(self.impl, self.prop, f.case, self.session.failures_dir, f"-{k + 1}"))
                        for k, f in enumerate(self.found or [Found(failed, message, "")])]
        outcome, message = judge(outcome, message)
        drawn = BY_NAME[self.prop].contexts if self.prop in BY_NAME else ()
        how = {"modes": ran(cover.contexts, drawn)} if drawn and cover.contexts else {}
        how.update({"threads": failed.notes["threads"]} if failed is not None and "threads" in failed.notes else {})
        return record(self.session, self.impl, self.prop, DTYPE_NAMES[self.dtype], outcome, message=message, **how,
                      examples=cover.examples, refused=cover.refused, domain=domain, seconds=seconds,
                      worst_units=worst.units, worst_ulps=worst.ulps, worst_where=where,
                      unclaimed=worst.unclaimed, replay=replay, failures=failures)


def harness_error(e: BaseException, message: str) -> str:
    """The result message for ``e`` (said as ``message``), raised in normcert's own checking code (the
    oracle, the bounds, the strategies, Hypothesis), not in the kernel's call: the harness's error."""
    return f"normcert's own error, not the kernel's: {type(e).__name__} in its checking code: {message}"


def outside_domain(session, impl, prop: str, dtype) -> Result | None:
    """A ``not-supported`` result, recorded, where ``dtype`` is outside the kernel's declared domain
    (the kernel is not called); None inside it."""
    if impl.domain.admits_dtype(DTYPE_NAMES[dtype]):
        return None
    return record(session, impl, prop, DTYPE_NAMES[dtype], "not-supported",
                  message=f"outside its declared domain ({impl.domain.describe()})")


def _refusal(impl, e: NotSupported) -> str:
    if impl.declares:
        return f"refused a case inside its declared domain ({impl.domain.describe()}): {e.why}"
    return (f"refused a case of a dtype it accepts: {e.why}; a kernel that supports part of the op declares "
            f"its domain (normcert_domain on the kernel, or --domain), and is certified on it")


def _refuses(dtype_name: str):
    """The check for a dtype whose sample the kernel refused: it must refuse every case."""
    def check(session, impl, case, worst):
        invoke(session, impl, case)  # NotSupported: consistent
        raise PropertyFailure(f"refused the op's sample in {dtype_name} (NotImplementedError) but accepted this "
                              f"case: support must hold for the whole dtype, or be declared (normcert_domain)")
    return check
