"""A run: the pytest plugin that drives the families over the kernels and gathers the results.

    plugin        the ``pytest11`` entry point: options, collection, the ``Suite``, the certificate
    runner        one family on one kernel and dtype under Hypothesis: the ``Result`` row
    outcomes      a ``Result`` as pytest's outcome (pass, fail, skip, xfail)

Imports the layers below (``properties.evidence`` and down); nothing above.
"""
