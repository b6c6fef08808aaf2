"""Triton's interpreter made cheaper per operation, with its semantics untouched: its types kept.

Under the interpreter every operation of every program goes through Triton's semantic layer, which
builds a new ``block_type`` for each result (``block_type.with_element_ty`` at each cast,
broadcast and splat; the builder's ``get_block_ty`` at each binary operation) and, for each new
``tensor``, a ``constexpr`` per dimension and a Triton ``tuple`` of them.  For a one-row-a-program
kernel (Liger's RMSNorm forward, 300 x 64) keeping them takes a fifth off a call (``benchmarks/interpreter.py``).

``install()`` (called by ``interpreter.install`` when the interpreter is active) keeps them:

* a block type is made once per (element type, shape) and handed out again after, wherever the
  element type can be a key (Triton's scalar types, equal by name); a pointer type cannot, and a
  block of pointers is made afresh as before;
* a tensor's ``numel`` and ``shape`` are made once per type object and shared by the tensors of
  that type, and a shape compared with itself is equal at once (Triton's ``tuple.__eq__`` compares
  the two lists of values, which a list does by identity first).

Neither is mutated after it is made: ``block_type`` sets its fields in ``__init__`` only, and a
Triton ``tuple`` has no ``__setitem__`` (its ``_setitem`` is the compiler's, which the interpreter
never runs), so kernel code cannot write into a shared shape.  Outputs are bitwise the same
(``test_interpreter``; ``benchmarks/interpreter.py`` prints both, side by side).
"""
from __future__ import annotations

import math


def _targets() -> tuple:
    """(owner, attribute) of each function of Triton's that ``install`` replaces, in the order of
    its replacements."""
    from triton.language import core  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    return ((core.block_type, "with_element_ty"), (interpreter.InterpreterBuilder, "get_block_ty"),
            (core.tensor, "__init__"), (core.tuple, "__eq__"))


def install() -> None:
    """Keep block types and tensors' shapes (the module docstring); a second call changes nothing.
    The functions replaced are kept on their replacements as ``normcert_built``, for the benchmark's
    side-by-side run and the test's."""
    from triton.language import core  # noqa: PLC0415

    if hasattr(core.tensor.__init__, "normcert_built"):
        return
    make = core.block_type
    kept: dict = {}

    def block(element_ty, shape):
        shape = tuple(shape)  # ints, as the semantic layer passes them; else unwrapped as Triton does
        if not all(type(s) is int for s in shape):
            shape = tuple(core._unwrap_shape(shape))
        key = (type(element_ty), element_ty, shape)
        try:
            return kept[key]
        except KeyError:
            made = kept[key] = make(element_ty, list(shape))
            return made
        except TypeError:  # a pointer type: no hash
            return make(element_ty, list(shape))

    def with_element_ty(self, scalar_ty):
        return block(scalar_ty, self.shape)

    def get_block_ty(self, dtype, shape):
        return block(dtype, shape)

    def tensor_init(self, handle, type):  # noqa: A002 - Triton's own parameter name
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        fields = getattr(type, "__dict__", {})
        shaped = fields.get("normcert_shape")
        if shaped is None:
            shape = type.shape if type.is_block() else ()
            shaped = (core.constexpr(math.prod(shape)), core.tuple([core.constexpr(s) for s in shape]))
            fields["normcert_shape"] = shaped
        self.numel, self.shape = shaped

    tuple_eq = core.tuple.__eq__

    def same_tuple(self, other):  # a shared shape against itself: what list equality gives
        return core.constexpr(True) if other is self else tuple_eq(self, other)

    for (owner, name), replacement in zip(_targets(), (with_element_ty, get_block_ty, tensor_init, same_tuple)):
        replacement.normcert_built = getattr(owner, name)
        setattr(owner, name, replacement)


def uninstall() -> None:
    """Triton's own functions back (for ``benchmarks/interpreter.py``'s side-by-side run)."""
    for owner, name in _targets():
        built = getattr(getattr(owner, name), "normcert_built", None)
        if built is not None:
            setattr(owner, name, built)
