"""What a kernel's signature says it takes of an op's options.

An op's *options* (``oracle.record.Arg.option``: the gated norm's ``group_size``) are arguments it
gained after kernels were written to its contract; the record passes one by keyword, and only in
the cases that give it.  A kernel written before the option existed has no parameter for it, and
is certified on the cases without it: its domain declares the option unsupported
(``domain.Domain.unsupported``), which the registry's record adds when the kernel is registered
(``impls.Impl``), and fitting then removes the option from every case (``properties.search.fitting``).

Kernel f takes option o where ``inspect.signature(f)`` has a parameter named o that can be passed
by keyword (positional-or-keyword or keyword-only), or a ``**kwargs``.  Where the signature cannot be
read (a C extension, a torch operator without a Python signature: ``inspect.signature`` raises), f is
assumed to take every option, as it is where it reads ``(*args, **kwargs)`` (a torch custom op, an
``nn.Module``'s ``__call__``, a wrapper without ``functools.wraps``): such a kernel that does not
declares ``unsupported=NAME`` itself, else the cases with the option are its failures.  A wrapper
made with ``functools.wraps`` is read through to the function it wraps (``__wrapped__``).
"""
from __future__ import annotations

import inspect
from typing import Callable

KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def takes(fn: Callable, name: str) -> bool:
    """Can ``fn`` be passed ``name=`` by keyword (module docstring; True where its signature cannot be read)?"""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return name in params and params[name].kind in KEYWORD


def lacking(rec, fn: Callable) -> tuple[str, ...]:
    """The options of op record ``rec`` that kernel ``fn`` does not take (``takes``), in the op's order."""
    return tuple(name for name in rec.options if not takes(fn, name))
