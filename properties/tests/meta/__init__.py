"""The meta-tests: normcert certifies kernels whose verdict is known and asserts it.

``planted/`` holds the planted-bug catalogue by op family (each kernel's expectation on its own
``expect`` decorator); the other ``planted_*`` modules, ``hostile`` and ``slow_triton`` hold the
kernels of one meta-test each.  A meta-test's results are never part of a certificate
(``properties.run.plugin``).
"""
