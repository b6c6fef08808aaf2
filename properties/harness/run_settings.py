"""The settings a ``normcert certify`` controller and the run it starts share, in a module that
imports nothing: the controller (``normcert.cli``) reads them before it starts the run, and
importing the plugin for them would load torch in a process that never calls a kernel (about 2 s
of every ``normcert certify``)."""

# examples per property and dtype; "large" is ci's plus the large family (a GPU: test_large)
PROFILES = {"dev": 4, "ci": 12, "thorough": 300, "large": 12}
RUN_RECORD = "NORMCERT_RUN_RECORD"  # where the controller writes its verdict as its last step (``cli``)
KERNEL_TIMEOUT = 60.0  # seconds, the default --kernel-timeout
FIRST_CALL = 5  # the first call of a specialisation may take this many times --kernel-timeout
PROGRESSING = 10
"""A call whose interpreted launches keep advancing (``sandbox.Worker``) is hung only after this many
times its limit: past that, a kernel that launches for ever (each program quick) is cut all the same."""
STALLED = FIRST_CALL + 1
"""Kernel timeouts of silence after which ``normcert certify`` ends a run as stalled: a first call
may take FIRST_CALL of them, the oracle and the checks between two calls far less than one."""
HEARTBEAT = "NORMCERT_HEARTBEAT"  # a file whose mtime the run touches as it makes progress (``beat``)
NEWS = "NORMCERT_NEWS"  # a file the run appends lines to as they happen, printed at once by ``cli`` (``run.news``)
