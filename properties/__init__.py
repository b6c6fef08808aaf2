"""normcert's properties: one test file per family (or pair), one check function each.

``families.FAMILIES`` is the one list of property families; the pytest tests
drive each family's check with Hypothesis, ``--replay`` calls it directly.
"""
