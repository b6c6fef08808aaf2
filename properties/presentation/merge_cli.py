"""The ``normcert merge`` command: the shard certificates of one run (``certify --shard K/N``) joined
into one certificate, judged again by the evidence rule (``evidence.shards.merge``).

Each input is read with ``report.load`` (held to the schema); bad input, a missing ``-o`` or an
output that would replace an input, one of its files or a file normcert did not write
(``certificate.why_not_written``, by ``files.why_not_writable``) is one line on standard error and exit status 4.  The merged
certificate (JSON, Markdown, badge) is written whatever its verdict; the exit status is 0 where it
is "certified", 1 otherwise, with each reason the shards do not make one run said on standard error.
"""
from __future__ import annotations

import sys

from ..evidence import shards
from ..evidence.certificate import SCHEMA, headline, outputs, why_not_written, write_files
from .report import load
from .report_cli import USAGE


def merge(a) -> int:
    """``normcert merge A.json B.json ... -o C.json``."""
    if not a.output:
        return _usage("-o C.json: give the merged certificate's path")
    named = []
    for path in a.certificates:
        try:
            named.append((path, load(path)))
        except ValueError as e:
            return _usage(f"{path}: {e}")
    problem = why_not_written(a.output, {p: f"a file of the certificate {c}" for c in a.certificates for p in outputs(c)})
    if problem:
        return _usage(f"-o {a.output}: {problem}")
    cert = shards.merge(named, SCHEMA)
    try:
        write_files(a.output, cert)
    except OSError as e:  # UnsafePath too: a link planted at the path
        return _usage(f"-o {a.output}: {getattr(e, 'strerror', None) or e}")
    for problem in shards.problems(named):
        print(f"normcert merge: {problem}", file=sys.stderr)
    print(f"normcert merge: {len(named)} certificate(s), {len(cert['results'])} results -> {a.output}\n"
          f"normcert verdict: {headline(cert)}")
    return 0 if cert["verdict"] == "certified" else 1


def _usage(message: str) -> int:
    print(f"normcert merge: {message}", file=sys.stderr)
    return USAGE
