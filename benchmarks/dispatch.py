"""Per-op cost of a cached kernel on a turbine device against torch eager, measured in one run.

    python benchmarks/dispatch.py [--device turbine:cpu] [--torch-device cpu] [--ops 1000] [--repeats 10]

Each case chains ``--ops`` adds (y = y + x), after a warm-up that compiles the kernel. "enqueue"
is the time to issue the chain; "end to end" also waits for the last result. Times are the best
of ``--repeats`` runs, in microseconds per op. Ratios are turbine end-to-end over torch.
"""

from __future__ import annotations

import argparse
import time

import torch

import turbine

CASES = {"add 4x8": (4, 8), "add 256x256": (256, 256), "add 1M": (1024, 1024)}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_per_op(shape: tuple[int, int], device: str, ops: int, repeats: int) -> float:
    x = torch.randn(shape, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        y = torch.zeros(shape, device=device)
        _sync(device)
        start = time.perf_counter()
        for _ in range(ops):
            y = y + x
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best / ops * 1e6


def turbine_per_op(shape: tuple[int, int], device: str, ops: int, repeats: int) -> tuple[float, float]:
    x = torch.randn(shape, device=device)
    warm = x + x
    warm.cpu()
    enqueue = end_to_end = float("inf")
    for _ in range(repeats):
        y = torch.zeros(shape, device=device)
        y.cpu()
        start = time.perf_counter()
        for _ in range(ops):
            y = y + x
        issued = time.perf_counter()
        y._storage.buffer.wait()
        done = time.perf_counter()
        enqueue = min(enqueue, issued - start)
        end_to_end = min(end_to_end, done - start)
    return enqueue / ops * 1e6, end_to_end / ops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="turbine:cpu")
    parser.add_argument("--torch-device", default="cpu")
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    workers = f", {turbine.config.cpu_workers} IREE CPU workers" if args.device.startswith("turbine:cpu") else ""
    print(f"{args.ops} chained adds, best of {args.repeats}, microseconds per op; {args.device} vs torch {args.torch_device}{workers}")
    print("| case | torch | turbine enqueue | turbine end to end | end to end / torch |")
    print("|---|---|---|---|---|")
    for name, shape in CASES.items():
        reference = torch_per_op(shape, args.torch_device, args.ops, args.repeats)
        enqueue, end_to_end = turbine_per_op(shape, args.device, args.ops, args.repeats)
        print(f"| {name} | {reference:.1f} | {enqueue:.1f} | {end_to_end:.1f} | {end_to_end / reference:.2f} |")
    stats = turbine.stats()
    print(f"kernels compiled: {stats['kernels_compiled']}, dispatches: {stats['dispatches']}")


if __name__ == "__main__":
    main()
