"""Telling a cell's failures apart (``kind_of``): what ``reduce`` keeps the same while it reduces a
failing case, and what a search for failures of other kinds seeks a new one of."""
from __future__ import annotations

import re


def kind_of(e: BaseException, message: str) -> str:
    """Which failure ``e`` (said as ``message``) is, for telling a cell's distinct failures apart: the
    raiser's own ``kind`` where it gives one (an output's name and whether its NaN pattern, an
    infinity or its error past the bound failed, ``Assessment.failure``; a kernel's exception type
    and the place it was raised, ``sandbox.kernel_code``), else its type and message with every
    number taken out (a shape or a value names the case, not the failure)."""
    return getattr(e, "kind", "") or f"{type(e).__name__}: " + re.sub(
        r"#(?:, #)+", "#", re.sub(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|\binf\b|\bnan\b", "#", message))
