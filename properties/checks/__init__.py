"""Each property family's check and case strategy (``families.FAMILIES`` holds them), one module
per family or pair; the test files only name the family they run (``runner``, ``outcomes``).

    check(session, impl, case, worst)     checks one case, raises PropertyFailure
    cases(op, dtype, device, bucket=None) the Hypothesis strategy of cases it checks
                                          (with a ``strategies.Bucket``: of that shape)
"""
