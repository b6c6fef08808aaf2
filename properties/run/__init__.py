"""A run: the pytest plugin that drives the families over the kernels and gathers the results.

    plugin        the ``pytest11`` entry point: options, collection, the ``Suite``, the certificate
    runner        one family on one kernel and dtype under Hypothesis: the ``Result`` row
    outcomes      a ``Result`` as pytest's outcome (pass, fail, skip, xfail)
    news          what a run says as it happens, for the command's console (events, one a line)
    announce      the controller's events from pytest's hooks (xdist's workers' reports too)

Imports the layers below (``properties.evidence`` and down); nothing above.
"""
