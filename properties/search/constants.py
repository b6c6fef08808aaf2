"""A seed's cases depend on the seed and the strategy alone, not on the modules a process imported.

Hypothesis (since 6.131) answers about 5 % of its integer draws (15 % of its float draws, and some
of its bytes and string draws) with a constant from one of two pools, picked with equal chance:

* its own pool (0, 1, -1, 2^k +- 1, the float edges ...): the same in every process;
* a *local* pool: every literal in the source of every module loaded so far that is not in
  site-packages, the standard library or a tests folder, read at each new draw once
  ``len(sys.modules)`` has changed, and cached as files under ``.hypothesis/constants`` in the
  working folder.

For normcert the local pool made the cases of one seed depend on the process, not the seed: which
modules earlier tests had imported (so a verdict changed with the xdist split: an undeclared
NaN-dropping amax was rejected in one worker and passed in another), the literals in the user's
kernel module (a kernel's folder may not change its verdict), and whether normcert was installed
as a wheel or in editable mode (a replayed seed on another machine drew other cases). It also wrote
files into the user's folder that they never named.

``own_constants_only()`` holds, for the span of a search, the local pool empty and the cache of
permitted constants normcert's own (its entries are then a function of the draw's constraints
and Hypothesis's own pool alone). Hypothesis's own pool stays: its edges are found as before.
A Hypothesis without local constants (before 6.131) is left as it is.
"""
from __future__ import annotations

import contextlib
import threading


def _replacements() -> tuple[object, dict]:
    """(Hypothesis's providers module, {attribute: normcert's value}) for the two attributes through
    which the local pool reaches a draw; (None, {}) for a Hypothesis without them."""
    try:
        from hypothesis.internal.cache import LRUCache  # noqa: PLC0415
        from hypothesis.internal.conjecture import providers  # noqa: PLC0415
        from hypothesis.internal.constants_ast import Constants  # noqa: PLC0415
    except ImportError:
        return None, {}
    names = ("_get_local_constants", "CONSTANTS_CACHE")
    if not all(hasattr(providers, name) for name in names):
        return None, {}
    none = Constants()
    # the cache's entries: (choice type, constraints) -> (own pool's permitted, ()), no process state
    return providers, dict(zip(names, (lambda: none, LRUCache(1024))))


_PROVIDERS, _OURS = _replacements()
_LOCK = threading.RLock()  # a search in one thread at a time holds Hypothesis's module in this state


@contextlib.contextmanager
def own_constants_only():
    """While open, Hypothesis draws its constants from its own pool only (see the module's docstring)."""
    if _PROVIDERS is None:
        yield
        return
    with _LOCK:
        saved = {name: getattr(_PROVIDERS, name) for name in _OURS}
        for name, value in _OURS.items():
            setattr(_PROVIDERS, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(_PROVIDERS, name, value)
