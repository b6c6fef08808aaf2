"""``python -m normcert``: the same as the ``normcert`` command."""
from normcert.cli import entry

entry()
