#!/usr/bin/env python
"""How fast are the registry's kernels?  Every op, eager vs torch.compile vs Triton.

For each op and shape (LLM-sized rows, bfloat16 by default), on the device it
runs on, prints the median time of the forward and of forward + backward,
the ratio to eager, and -- on a GPU -- the memory-traffic lower bound: the
bytes the op must move (every input read once, every output written once)
divided by the bandwidth of a device-to-device copy measured in the same run.

On CPU, Triton kernels run under TRITON_INTERPRET=1, a debugging interpreter
(numpy, one program at a time): it is not a performance path, and the table
says so instead of timing it.

    python benchmarks/kernels.py                       # cuda if present, else cpu
    python benchmarks/kernels.py --shapes 32x8192 --dtype float32 --reps 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from normcert import impls
from normcert.oracle import OPS
from normcert.properties.evidence.certificate import cpu_name

DEFAULT_SHAPES = ((4096, 4096), (32, 8192))
BACKENDS = ("eager", "compiled", "triton")


def inputs(op: str, rows: int, n: int, dtype, device, grad: bool) -> dict:
    """The op record's sample input (rows x n; 2n wide where the op splits its rows in halves);
    the inputs that get gradients require them when ``grad``."""
    rec = OPS[op]
    a = rec.sample(dtype, device, rows=rows, width=2 * n if rec.halves else n)
    for k in rec.grads:
        a[k].requires_grad_(grad)
    return a


def call(impl, a: dict) -> tuple:
    return OPS[impl.op].call_outputs(impl.fn, a)


def bytes_moved(a: dict, outs) -> int:
    tensors = [v for v in a.values() if isinstance(v, torch.Tensor)]
    return sum(v.numel() * v.element_size() for v in tensors) + sum(o.numel() * o.element_size() for o in outs)


def timed(fn, device, reps: int) -> float:
    """Median wall time in ms of fn() over reps runs, after two warm-up runs."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(device) -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write)."""
    src = torch.empty(1 << 29, dtype=torch.float16, device=device)
    ms = timed(lambda: src.clone(), device, 10)
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in DEFAULT_SHAPES))
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    impls.ensure_triton_mode(args.device)
    dtype = getattr(torch, args.dtype)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    device = args.device
    name = torch.cuda.get_device_name() if device == "cuda" else cpu_name()
    bw = copy_bandwidth(device) if device == "cuda" else None
    print(f"device: {device} ({name}); torch {torch.__version__}; threads {torch.get_num_threads()}; dtype {args.dtype}")
    if bw:
        print(f"measured copy bandwidth: {bw / 1e9:.0f} GB/s (the lower bound's denominator)")
    print()
    head = f"{'op':<13} {'shape':<11} {'backend':<9} {'fwd ms':>9} {'x eager':>8} {'fwd+bwd ms':>11} {'x eager':>8} {'bound ms':>9}"
    print(head)
    print("-" * len(head))
    registry = [i for i in impls.registry() if i.backend in BACKENDS]
    for op in impls.OPS:
        for rows, n in shapes:
            base = {}
            for impl in sorted((i for i in registry if i.op == op), key=lambda i: BACKENDS.index(i.backend)):
                label = f"{op:<13} {f'{rows}x{n}':<11} {impl.backend:<9}"
                if impl.backend == "triton" and device == "cpu":
                    print(f"{label} {'not timed: Triton interpreter on CPU is a correctness path, not a fast one':>60}")
                    continue
                if "matrix" in [a.kind for a in OPS[op].args] and rows * n * n > 2 ** 32 and device == "cpu":
                    print(f"{label} {'skipped: n x n sublayer matmul dominates on CPU':>60}")
                    continue
                a = inputs(op, rows, n, dtype, device, grad=False)
                with torch.no_grad():
                    fwd = timed(lambda: call(impl, a), device, args.reps)
                    outs = call(impl, a)
                bound = f"{bytes_moved(a, outs) / bw * 1e3:9.3f}" if bw else f"{'-':>9}"
                cells = [fwd, None]
                if impl.backward:
                    ag = inputs(op, rows, n, dtype, device, grad=True)
                    cot = [torch.ones_like(o) for o in call(impl, ag)]

                    def fwd_bwd():
                        torch.autograd.backward(call(impl, ag), cot)
                        for k in OPS[op].grads:
                            ag[k].grad = None

                    cells[1] = timed(fwd_bwd, device, args.reps)
                base.setdefault("eager", cells)
                ratios = [c / b if c is not None and b else None for c, b in zip(cells, base["eager"])]
                fmt = lambda v, w, spec: f"{v:{w}{spec}}" if v is not None else f"{'-':>{w}}"  # noqa: E731
                print(f"{label} {fmt(cells[0], 9, '.3f')} {fmt(ratios[0], 8, '.2f')} "
                      f"{fmt(cells[1], 11, '.3f')} {fmt(ratios[1], 8, '.2f')} {bound}")


if __name__ == "__main__":
    main()
