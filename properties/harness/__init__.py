"""The harness: how normcert calls one kernel on one case and measures what came back.

    sandbox       one call: a kernel's exceptions, hangs, writes to its inputs, its timeout
    measure       outputs against the oracle under the error model (``PropertyFailure``)
    probes        the one-call questions asked of a kernel (does it run interpreted, backward, ...)
    session       one run's state: device, seed, the kernels under test, caches
    run_settings  the run's constants (profiles, timeouts, heartbeat), imported without torch
    autotune      an autotuned Triton kernel run under each of its configs
    interpreter, interpreter_bf16, interpreter_fp8, interpreter_probes
                  Triton's CPU interpreter made to compute as a GPU does, and the probes of each gap

Imports ``oracle``, ``impls``, ``properties.declared`` and ``properties.search``; nothing above.
"""
