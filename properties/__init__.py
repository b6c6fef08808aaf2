"""normcert's properties.

``families.FAMILIES`` is the one list of property families; each holds its check
and strategy (``checks``).  The layers below them: ``sandbox`` calls a kernel,
``measure`` compares its outputs with the oracle, ``probes`` asks a kernel the
one-call questions, ``runner`` drives Hypothesis and makes the ``Result``,
``outcomes`` maps a result to pytest's outcome.  The test files are thin: each
test names its family (``normcert_family`` mark) and is imported by nothing.
``--replay`` calls a family's check directly.  The import policy is the plugin's
(``plugin``).
"""
