"""JSON read with bounded work: a file handed to normcert (a certificate, a replay file's metadata)
may be hostile, and 200,000 nested arrays must end in one line, not a RecursionError.

``loads(text)`` is ``json.loads`` whose nesting (an object or array inside another counts one
level) is at most ``MOST_NESTING``, measured without recursion; anything deeper, or deep enough to
exhaust the parser's own recursion, is a ValueError saying so.  Nothing normcert writes nests
deeper than 8 (a certificate's row's failure's field; a replay file's per-element row).
"""
from __future__ import annotations

import json

MOST_NESTING = 32
"""The deepest nesting accepted: four times what normcert writes, far below Python's recursion limit."""


class TooDeep(ValueError):
    """JSON nested deeper than ``MOST_NESTING``."""


def depth(value) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar: 0, ``[]``: 1, ``[[1]]``: 2), walked with a stack."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if d > MOST_NESTING:
                break
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def loads(text: str | bytes):
    """``json.loads(text)``, refusing (``TooDeep``, a ValueError) nesting deeper than ``MOST_NESTING``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested deeper than the {MOST_NESTING} levels a normcert file may hold") from None
    if depth(value) > MOST_NESTING:
        raise TooDeep(f"nested deeper than the {MOST_NESTING} levels a normcert file may hold")
    return value
