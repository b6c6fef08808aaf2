"""For the tests: read a certificate a run wrote, and hold it to the published schema
(``normcert-certificate.schema.json``, ``normcert schema``): every certificate a test reads is validated."""
from __future__ import annotations

import json

import jsonschema

from ..evidence.certificate import SCHEMA, schema


def read_certificate(path) -> dict:
    """The certificate at ``path``, after checking it against the schema (``jsonschema``)."""
    with open(path) as f:
        cert = json.load(f)
    assert cert.get("schema") == SCHEMA == schema()["$id"]
    jsonschema.validate(cert, schema())
    return cert
