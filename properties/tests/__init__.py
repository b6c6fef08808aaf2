"""normcert's tests of itself: collected by ``pytest -n 2`` in the clone, never by a certify run.

The oracle's, the error model's, the files', the command's and the report's own tests sit here,
beside their helpers (``*_helpers``, ``report_samples``, ``extraction``); ``meta`` holds the
meta-tests, which certify planted kernels and assert their verdicts.  They may import any layer.
"""
