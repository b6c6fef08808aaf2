"""What a person reads: the HTML report, the comparison of two certificates, their commands.

    report        one certificate as one offline HTML page (``report_templates/``)
    report_replay the replay cards of a report
    compare       the cells that changed between two certificates
    report_cli    ``normcert report`` and ``normcert compare``
    console       what ``normcert certify`` and ``replay`` print while the run goes on

Imports ``properties.evidence``; judges the rows again rather than trusting a stored verdict. The
console imports nothing of normcert: ``cli`` feeds it the run's events (``properties.run.news``).
"""
