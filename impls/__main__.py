"""``normcert list`` (or ``python -m normcert.impls``): the registry as a table, one line per implementation."""
from __future__ import annotations

import torch

from . import ensure_triton_mode, registry


def main() -> None:
    ensure_triton_mode("cuda" if torch.cuda.is_available() else "cpu")
    rows = [("op", "name", "backend", "devices", "convention", "declared domain", "backward", "expected failure")]
    for i in registry():
        domain = i.domain.spec() or "all"
        backward = {True: "yes", False: "no", None: "if grad_fn"}[i.backward]
        rows.append((i.op, i.name, i.backend, ",".join(i.devices), i.convention or "-", domain, backward,
                     i.expected_failure[:60]))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
