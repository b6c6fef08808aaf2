"""A normcert run's state: its settings, the kernels under test, and what it found.

The plugin makes one ``Session`` per process from the command line and hands it
to the property tests through the ``normcert_session`` fixture; a meta-test makes
its own.  Nothing else holds run state: the sandbox, the runner, the certificate and the
replay writer take the session (or the field they need) as an argument.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from . import pulse
from .autotune import Forcing, tuners
from .run_settings import HEARTBEAT
from ..search.buckets import LONG_RUN_CALLS, LONG_RUN_EVERY



@dataclass
class Session:
    """device: where the kernels run; seed: the global seed every per-test seed derives from;
    bitwise: bitwise families fail the run (else they warn); require_backward: a kernel whose
    outputs carry no grad_fn fails the backward families (else: not-certified, forward only);
    failures_dir: where replay files go;
    kernel_timeout: seconds a kernel call may go without a result or progress before it is declared hung;
    impls: the kernels under test; eager: op -> the registry's eager kernel;
    replay: (file metadata, case) and replay_impl when the run replays a file;
    results: a ``runner.Result`` per (kernel, family, dtype) run here;
    hung: kernel id -> message, for a kernel the watchdog gave up on: its later calls fail at once until
    its result is recorded (``runner.record``), and the next result's calls run in a fresh thread;
    slow: kernel id -> (seconds, what its next result says) of its slowest call since its last result
    that ran past its limit while its interpreted launches advanced (``sandbox.Worker.run``);
    called: the (kernel id, what, specialisation) the watchdog has called (``sandbox.kernel_code``);
    worker: the thread kernel calls run in (``sandbox.Worker``), made by the first call;
    interpreter: the corrections made to Triton's interpreter (``properties.harness.interpreter``), None without it;
    interpreted: (kernel id, dtype) -> does it run under that interpreter (``probes.runs_interpreted``);
    weightless: (kernel id, dtype) -> does it accept None for the op's optional weight and bias
    (``probes.accepts_weightless``);
    profile: the run's profile (``run_settings.PROFILES``): "large" adds the large family;
    returned: kernel id -> the outputs of its last calls, held to catch a reused buffer
    (``sandbox.check_not_reused``);
    heartbeat: the file ``beat`` touches (``$NORMCERT_HEARTBEAT``, set by ``normcert certify``), or None;
    pulse: the thread that beats between beats where the run advances (``pulse.start``, at the first
    beat of a run that has a heartbeat), or None;
    tuned: kernel id -> its autotuners, forced config by config (``forcing``);
    first_calls: (kernel id, dtype) -> what was wrong with the kernel's first call of that dtype in this
    process ("" if nothing: ``probes.first_call``), the support probe's call;
    compiled: kernel id -> the kernel as ``torch.compile`` makes it (``families.compiled``), made once;
    uncapturable: kernel id -> why its CUDA-graph capture failed, for its next served result's modes
    (``families.graphed``);
    long_run: the calls the served family's long run makes in a row in the dtype that makes the full
    count (``families.long_run``, ``schedule.long_run_calls``; ``buckets.LONG_RUN_CALLS`` unless the
    run says fewer, ``run.plugin``);
    long_run_every: at most the calls it makes in each other dtype (``buckets.LONG_RUN_EVERY``, or
    ``buckets.QUICK_LONG_RUN_EVERY`` in the clone's quick tier, ``run.plugin``);
    dtypes: the names of the dtypes of the run's declared scope (``--normcert-dtype``), None for all:
    the rotated buckets and the long run's full count go to one of them (``schedule.rotated``);
    long_runs: kernel id -> its current result's long run (``families.long_run.LongRun``), until the
    result is recorded (``runner.record``: its ``calls``);
    most_failures: the most distinct failures a failing cell's search reports (``runner.MOST_FAILURES``
    in the plugin's runs; 1, the first alone, in a meta-test's own session, which asks whether a bug dies)."""

    device: str = "cpu"
    seed: int = 0
    bitwise: bool = False
    require_backward: bool = False
    failures_dir: str = "failures"
    kernel_timeout: float = 60.0
    impls: list = field(default_factory=list)
    eager: dict = field(default_factory=dict)
    replay: tuple | None = None
    replay_impl: object = None
    results: list = field(default_factory=list)
    hung: dict[str, str] = field(default_factory=dict)
    slow: dict[str, tuple] = field(default_factory=dict)
    called: set = field(default_factory=set)
    worker: object = None
    interpreter: list | None = None
    interpreted: dict = field(default_factory=dict)
    weightless: dict = field(default_factory=dict)
    profile: str = "ci"
    returned: dict = field(default_factory=dict)
    heartbeat: str | None = field(default_factory=lambda: os.environ.get(HEARTBEAT))
    pulse: object = None
    tuned: dict = field(default_factory=dict)
    first_calls: dict = field(default_factory=dict)
    compiled: dict = field(default_factory=dict)
    uncapturable: dict[str, str] = field(default_factory=dict)
    long_run: int = LONG_RUN_CALLS
    long_run_every: int = LONG_RUN_EVERY
    dtypes: tuple | None = None
    long_runs: dict = field(default_factory=dict)
    most_failures: int = 1

    def forcing(self, impl) -> Forcing:
        """The kernel's autotuners, run under the config the runner selects (``properties.harness.autotune``);
        found at the first call.  On CPU (Triton's interpreter) configs are told apart by their
        kwargs alone."""
        if impl.id not in self.tuned:
            self.tuned[impl.id] = Forcing(tuners(impl.fn), interpreted=self.device == "cpu")
        return self.tuned[impl.id]

    def beat(self) -> None:
        """The run made progress (a kernel call returned, a test started): touch the heartbeat file
        that ``normcert certify`` watches, if it set one, and start the run's ``pulse`` at the first
        beat (it beats between beats while interpreted programs run or the oracle computes).  A
        process stuck in kernel code outside the watchdog (a finalizer, an exception's ``__str__``,
        an import) stops beating and is ended."""
        if self.heartbeat:
            if self.pulse is None:
                self.pulse = pulse.start(self.heartbeat)
            try:
                os.utime(self.heartbeat)
            except OSError:
                pass  # the parent's folder is gone: the parent is gone too

    def derive_seed(self, *parts) -> int:
        """A per-test seed from the global seed: the same whatever the worker split."""
        h = hashlib.sha256(":".join(str(p) for p in (self.seed,) + parts).encode()).digest()
        return int.from_bytes(h[:8], "little")
