#!/usr/bin/env python
"""What do normcert's changes of cost save under Triton's interpreter?

Triton's interpreter binds ``triton.language``'s builtins at every launch and again at every
``@triton.jit`` helper call; ``normcert.properties.harness.interpreter`` binds each language module
once for the process, and ``interpreter_types`` keeps the block types and tensor shapes the
semantic layer builds at each operation (changes of cost, none of semantics).  For each registry
Triton kernel's forward, at a small and a large shape, this prints the median time of one call
with Triton's own binding at every call, with the language bound once, and with the types kept
too, side by side in one run, and whether the three gave the same bits.

    python benchmarks/interpreter.py                   # bfloat16, 3x19 and 257x4096
    python benchmarks/interpreter.py --shapes 8x512 --dtype float32 --reps 3
"""
from __future__ import annotations

import argparse
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
from triton.runtime import interpreter as triton_interpreter  # noqa: E402

from normcert import impls  # noqa: E402
from normcert.properties.harness import interpreter, interpreter_types  # noqa: E402
from normcert.oracle.formats import bits  # noqa: E402
from normcert.properties.evidence.certificate import cpu_name  # noqa: E402

from kernels import call, inputs, timed  # noqa: E402

DEFAULT_SHAPES = ((3, 19), (257, 4096))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32", "float64"), default="bfloat16")
    p.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in DEFAULT_SHAPES))
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    corrected = interpreter.install()
    once = triton_interpreter._patch_lang
    every = once.normcert_every_call
    print(f"device: cpu ({cpu_name()}); torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"dtype {args.dtype}; interpreter corrections: {', '.join(corrected) or 'none'}")
    print()
    modes = ((every, interpreter_types.uninstall), (once, interpreter_types.uninstall), (once, interpreter_types.install))
    head = (f"{'op':<27} {'shape':<9} {'every call ms':>13} {'once ms':>9} {'+types ms':>9} {'ratio':>6}  "
            "same bits")
    print(head)
    print("-" * len(head))
    for impl in (i for i in impls.registry() if i.backend == "triton"):
        rec = impls.OPS[impl.op]
        for rows, n in shapes:
            n = min(n, rec.max_width // 2 if rec.halves else rec.max_width)  # deep_norm: an n x n sublayer
            a = inputs(impl.op, rows, n, dtype, "cpu", grad=False)
            times, outs = [], []
            for binding, types in modes:
                triton_interpreter._patch_lang = binding
                types()
                with torch.no_grad():
                    times.append(timed(lambda: call(impl, a), "cpu", args.reps))
                    outs.append(call(impl, a))
            same = all(torch.equal(bits(x), bits(y)) and torch.equal(bits(x), bits(z)) for x, y, z in zip(*outs))
            print(f"{impl.op:<27} {f'{rows}x{n}':<9} {times[0]:13.1f} {times[1]:9.1f} {times[2]:9.1f} "
                  f"{times[0] / times[2]:6.2f}  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
