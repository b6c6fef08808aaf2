"""One record per property family: what it checks, on which cases, for which ops, how it gates.

``FAMILIES`` is the one list: its order is the certificate's (a verdict names a
kernel's first failure in this order), and the pytest tests, ``--replay``, the
meta-tests and the certificate all read it.  A family holds its check and its
strategy, from this package's modules (one per family or pair: ``accuracy``, ``gradients``, ...;
``gradcheck``, ``graphed`` and ``long_run`` serve the gradients and served families):

    check(session, impl, case, worst)    checks one case, raises PropertyFailure
    cases(op, dtype, device, bucket=None) the Hypothesis strategy of cases it checks
                                          (with a ``buckets.Bucket``: of that shape)

and its one test, in ``properties.suite``, names it with the ``normcert_family`` mark (``run.plugin``).
The layer imports ``properties.harness``, ``properties.search`` and below; nothing above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ...oracle import OPS, Op
from ...oracle.formats import DTYPE_NAMES
from ...oracle.validate import finite_number

from . import accuracy, agreement, bitwise, compiled, contract, fusion, gradients, invariance, large, masks, served
from ..search.buckets import BUCKETS, LARGE, LONG_RUN, LONG_RUN_CALLS
from ..search.strategies import REFILLS, transforms

# the call past 2**20 elements is accuracy's alone (its cost); the near-constant groups accuracy's and gradients';
# the ties rows accuracy's (and agreement's): an exact check of a tie is the accuracy check's, and their oracle
# decides each tie in mpmath (0.25 s a case against 0.01 s), which every family would pay
SHAPES = tuple(b for b in BUCKETS if b not in ("million", "near_constant", "loud", "ties"))


def _every_op(op: Op) -> bool:
    return True


def _has_backward(op: Op) -> bool:
    """An op with gradients (the FP8 quantisation ops are inference-only)."""
    return bool(op.grads)


def _batched_rows(op: Op) -> bool:
    """A rowwise op whose rows may be regrouped into batches of any size: not a masked MoE op, whose
    rows are tokens of experts with a count each (its row-independence check stands for it)."""
    return op.rowwise and op.counts is None


@dataclass(frozen=True)
class Param:
    """A property's own draw, carried in ``Case.params`` and in a replay file: its name and kind.

    seed          an integer in [0, 2**32)
    count         an integer >= 1
    row           an integer in [0, rows): a row of the case's main tensor (its leading dims flattened)
    power of two  2**k for an integer k in [-6, 6] (a scale that keeps every value exact)
    float         a finite number
    choice        one of ``choices(op)``

    default: the value of a file written before the param existed (None: every file must carry it);
    most: a count's largest value (a replay file asking for more is refused: a long run of 2**62 calls
    would replay for ever)."""

    name: str
    kind: str
    choices: Callable[[Op], tuple[str, ...]] | None = None
    default: object = None
    most: int = 2 ** 62

    def problem(self, op: Op, value, rows: int) -> str | None:
        """Why ``value`` cannot be this parameter of a case of ``op`` with ``rows`` rows (None: it can)."""
        if self.kind == "choice":
            allowed = self.choices(op)
            return None if isinstance(value, str) and value in allowed else \
                f"expected one of {', '.join(map(repr, allowed))} for {op.name}"
        if not finite_number(value):
            return "expected a finite number"
        if self.kind == "float":
            return None
        if self.kind == "power of two":
            k = math.log2(value) if value > 0 else 0.5
            return None if k == int(k) and -6 <= k <= 6 else "expected 2**k for an integer k in [-6, 6]"
        if not isinstance(value, int):
            return "expected an integer"
        lo, hi = {"seed": (0, 2 ** 32 - 1), "count": (1, self.most), "row": (0, rows - 1)}[self.kind]
        return None if lo <= value <= hi else f"expected an integer in [{lo}, {hi}]"


def _refills(op: Op) -> tuple[str, ...]:
    return REFILLS


@dataclass(frozen=True)
class Family:
    """name: as the certificate writes it; check and cases: its check of one case and its
    strategy (None where the family is not a per-case check: gradcheck runs torch's own);
    applies: the ops it has a claim about; bitwise: a bitwise claim, failing the run only
    under --bitwise (else a warning); core: a case study must run it to count as checked;
    backward: it checks a kernel's backward (``runner.forward_only``: a forward-only kernel
    is not certified by it); buckets: the scheduled shapes (``buckets.BUCKETS``) it checks
    on every (kernel, dtype) besides its random search; profile: the family runs only under
    this profile (``--profile large``: on a GPU) and checks its buckets alone, no random search;
    params: its own draws beside the op's arguments (``Param``), which a replay file must carry;
    pair: it checks a kernel against the kernel it must agree with (``Impl.agrees_with``, ``--agree``)
    and runs on such kernels alone; divide: its random search takes the profile's examples divided by
    this (``examples``): the served family calls the kernel once per mode on each case; compiles: it
    runs on kernels a compiled model calls alone (``Impl.compiles``: a torch operator, or --compile);
    contexts: the calling-context fields its strategy draws (``search.context``), which its result counts;
    tries: how many times the reduction (``run.reduce``) checks a smaller case before it counts it as
    passing: a failure that shows by chance (two calls of a kernel whose sums race differ in one call
    pair of two on some shapes) may not show on the first."""

    name: str
    check: Callable | None
    cases: Callable | None
    applies: Callable[[Op], bool] = _every_op
    bitwise: bool = False
    core: bool = False
    backward: bool = False
    buckets: tuple[str, ...] = ()
    profile: str | None = None
    params: tuple[Param, ...] = ()
    pair: bool = False
    divide: int = 1
    compiles: bool = False
    contexts: tuple[str, ...] = ()
    tries: int = 1

    def covers(self, impl, bitwise: bool) -> bool:
        """Does the family run on ``impl``?  It must have a claim about the op; a bitwise family
        skips kernels registered as expected to fail (the case studies) unless ``bitwise``: their
        registered reason is numerical, and without --bitwise a bitwise result is only a warning.
        A pair family runs on a kernel that must agree with another, a compiling family on a kernel
        a compiled model calls."""
        return (self.applies(OPS[impl.op]) and (bitwise or not (self.bitwise and impl.expected_failure))
                and (not self.pair or impl.agrees_with is not None) and (not self.compiles or impl.compiles))


FAMILIES: tuple[Family, ...] = (
    Family("accuracy", accuracy.check_accuracy, accuracy.contextual_cases, core=True, buckets=BUCKETS,
           contexts=accuracy.DRAWN),
    Family("contract", contract.check_contract, contract.contract_cases, core=True),
    Family("extremes", accuracy.check_accuracy, accuracy.extreme_cases, core=True, buckets=SHAPES),
    Family("served", served.check_served, served.served_cases, core=True, divide=3,
           buckets=("odd", "strided", LONG_RUN),
           params=(Param("cot_seed", "seed"), Param("calls", "count", default=1, most=LONG_RUN_CALLS))),
    Family("compiled", compiled.check_compiled, compiled.compiled_cases, divide=3, compiles=True,
           buckets=("odd", "strided")),
    Family("fusion", fusion.check_fusion, fusion.fusion_cases, applies=lambda op: op.unfused is not None,
           buckets=SHAPES),
    Family("padding", masks.check_padding, masks.padded_cases,
           applies=lambda op: op.mask is not None or op.counts is not None,
           params=(Param("fill", "choice", _refills), Param("fill_seed", "seed"))),
    Family("row-independence", masks.check_row_independence, masks.row_cases, applies=lambda op: op.rowwise,
           params=(Param("row", "row"), Param("fill", "choice", _refills), Param("fill_seed", "seed"))),
    Family("invariance", invariance.check_invariance, invariance.invariance_cases,
           applies=lambda op: op.scale_invariant or op.shift_invariant, buckets=SHAPES,
           params=(Param("transform", "choice", transforms), Param("c", "power of two"), Param("d", "float"))),
    Family("gradients", gradients.check_gradients, gradients.gradient_cases, applies=_has_backward, core=True,
           backward=True, buckets=SHAPES + ("near_constant", "loud"), params=(Param("cot_seed", "seed"),),
           contexts=gradients.DRAWN),
    Family("gradcheck", None, None, applies=_has_backward, backward=True),
    Family("determinism", bitwise.check_determinism, bitwise.determinism_cases, bitwise=True, tries=4),
    Family("batch-invariance", bitwise.check_batch_invariance, bitwise.batch_cases,
           applies=_batched_rows, bitwise=True, buckets=("odd", "strided"), params=(Param("shift", "row"),)),
    Family("agreement", agreement.check_agreement, accuracy.accuracy_cases, buckets=BUCKETS, pair=True),
    Family("large", large.check_large, large.large_cases, applies=_batched_rows, buckets=LARGE,
           profile="large", params=(Param("limit", "count"),)),
)
BY_NAME = {f.name: f for f in FAMILIES}
CASE_CHECKS = tuple(f for f in FAMILIES if f.check)  # the families a replay file can name


def examples(family: Family, profile_examples: int) -> int:
    """The random examples of one run of ``family`` under a profile of ``profile_examples``: divided by
    the family's ``divide``, at least 2 (the served family: 12 // 6 = 2 cases under ci, besides its buckets)."""
    return max(2, profile_examples // family.divide)


def runs(family: Family, impl, device: str, bitwise: bool, profile: str) -> bool:
    """Does a run on ``device`` under ``profile`` leave a result of ``family`` on ``impl`` (given
    --bitwise or not)?  Collection parametrizes every kernel the family ``covers`` on the device;
    of those, a kernel registered without a backward skips the backward families, and a family of
    a profile skips outside it (``outcomes.certify_large``), with no result either way."""
    if device not in impl.devices or not family.covers(impl, bitwise):
        return False
    if family.backward and impl.backward is False:
        return False  # registered without a backward: the test skips, no claim either way
    return family.profile is None or (family.profile == profile and device == "cuda")


def expected(impls, device: str, bitwise: bool, profile: str, properties=None, dtypes=None) -> set[tuple[str, str, str]]:
    """Every (kernel id, family, dtype) a complete run checks: a certificate is "certified" only when
    each of them has a result.  ``properties`` / ``dtypes``: the run's declared scope (None: all).
    gradcheck runs in float64 only."""
    names = [n for n in DTYPE_NAMES.values() if dtypes is None or n in dtypes]
    return {(i.id, f.name, d) for i in impls for f in FAMILIES
            if (properties is None or f.name in properties) and (runs(f, i, device, bitwise, profile)
                                                               or _declared_elsewhere(f, i, device, bitwise, properties))
            for d in names if f.name != "gradcheck" or d == "float64"}


def _declared_elsewhere(family: Family, impl, device: str, bitwise: bool, properties) -> bool:
    """A family the run's scope names (``--property large``) that covers the kernel but runs only under
    another profile or device: named, it is expected, so a run where it cannot run is not certified
    ("not run"), never certified on a scope that lists it."""
    return (properties is not None and family.profile is not None and device in impl.devices
            and family.covers(impl, bitwise) and not (family.backward and impl.backward is False))
