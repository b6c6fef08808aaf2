"""normcert's properties, in layers.  Each layer is a subpackage whose docstring says what it holds;
a module imports its own layer and those below it, never one above (``tests/test_architecture.py``
reads every import and holds this):

    suite/         what a certify run collects, by this folder's path: one thin test module per
                   property family, and the replay test                              (top)
    presentation/  the HTML report, compare, their commands
    run/           the pytest plugin, the runner that drives Hypothesis, the outcomes
    evidence/      the verdict from the rows, the certificate, the replay files
    families/      one record per property family (``FAMILIES``) and the check each runs
    harness/       one call of a kernel and its measure against the oracle: the sandbox, the
                   probes, the session, autotune, Triton's interpreter made to compute as a GPU
    search/        the cases: strategies, buckets, fitting into a domain, calling modes
    --------       ``normcert.impls``: the registry and the kernels (it sits here, between the two)
    declared/      what a kernel declares: its domain and its calling convention    (bottom)

Below them all is ``normcert.oracle``.  ``tests/`` holds normcert's tests of itself (``meta/``: the
meta-tests and their planted kernels): ``pytest`` in the clone collects it, a certify run never does.
"""
