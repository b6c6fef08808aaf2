"""What a person reads: the HTML report, the comparison of two certificates, their commands.

    report        one certificate as one offline HTML page (``report_templates/``)
    report_replay the replay cards of a report
    compare       the cells that changed between two certificates
    report_cli    ``normcert report`` and ``normcert compare``

Imports ``properties.evidence``; judges the rows again rather than trusting a stored verdict.
"""
