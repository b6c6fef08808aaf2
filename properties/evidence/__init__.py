"""The evidence a run leaves: the verdict, the certificate, the replay files.

    verdict       the verdict from the result rows alone
    files         writing files without following links or overwriting what is not ours
    certificate   the JSON and Markdown certificate (``normcert-certificate.schema.json`` beside it)
    replay        one failing case saved to a file and read back
    shards        a run split into shards (``--shard K/N``) and their certificates merged into one
    reproducer    a replay file's case as a standalone script for an upstream bug report

Imports the layers below (``properties.families`` and down); nothing above.
"""
