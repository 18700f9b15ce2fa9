"""Per-op cost of a cached kernel on a turbine device against torch eager, measured in one run.

    python benchmarks/dispatch.py [--device turbine:cpu] [--torch-device cpu] [--ops 1000] [--repeats 30]

Each case chains ``--ops`` adds (y = y + x), after a warm-up that compiles the kernel. "enqueue"
is the time to issue the chain; "end to end" also waits for the last result. torch and turbine
take turns, one chain each per repeat, so a burst of load from other tenants of a shared machine
hits both. The table gives the best repeat (the cost of the op itself) and the median (what a
loaded machine gives), in microseconds per op; the ratio is turbine's best end to end over
torch's best.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

import turbine

CASES = {"add 4x8": (4, 8), "add 256x256": (256, 256), "add 1M": (1024, 1024)}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_chain(shape: tuple[int, int], device: str, ops: int) -> Callable[[], float]:
    """A function that runs one chain on torch and returns its seconds."""
    x = torch.randn(shape, device=device)

    def run() -> float:
        y = torch.zeros(shape, device=device)
        _sync(device)
        start = time.perf_counter()
        for _ in range(ops):
            y = y + x
        _sync(device)
        return time.perf_counter() - start

    return run


def turbine_chain(shape: tuple[int, int], device: str, ops: int) -> Callable[[], tuple[float, float]]:
    """A function that runs one chain on turbine and returns (enqueue, end-to-end) seconds."""
    x = torch.randn(shape, device=device)
    (x + x).cpu()  # compiles (or loads) the kernel

    def run() -> tuple[float, float]:
        y = torch.zeros(shape, device=device)
        y.cpu()
        start = time.perf_counter()
        for _ in range(ops):
            y = y + x
        issued = time.perf_counter()
        y._storage.buffer.wait()
        return issued - start, time.perf_counter() - start

    return run


def measure(shape: tuple[int, int], args: argparse.Namespace) -> dict[str, list[float]]:
    """Per-op microseconds of every repeat, torch and turbine interleaved."""
    reference = torch_chain(shape, args.torch_device, args.ops)
    ours = turbine_chain(shape, args.device, args.ops)
    reference()
    ours()
    times: dict[str, list[float]] = {"torch": [], "enqueue": [], "end to end": []}
    scale = 1e6 / args.ops
    for _ in range(args.repeats):
        times["torch"].append(reference() * scale)
        enqueue, end_to_end = ours()
        times["enqueue"].append(enqueue * scale)
        times["end to end"].append(end_to_end * scale)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="turbine:cpu")
    parser.add_argument("--torch-device", default="cpu")
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    workers = f", {turbine.config.cpu_workers} IREE CPU workers" if args.device.startswith("turbine:cpu") else ""
    print(
        f"{args.ops} chained adds, {args.repeats} repeats, microseconds per op (best / median); "
        f"{args.device} vs torch {args.torch_device}{workers}"
    )
    print("| case | torch | turbine enqueue | turbine end to end | end to end / torch (best) |")
    print("|---|---|---|---|---|")
    for name, shape in CASES.items():
        times = measure(shape, args)
        best = {k: min(v) for k, v in times.items()}
        cells = " | ".join(f"{best[k]:.1f} / {statistics.median(v):.1f}" for k, v in times.items())
        print(f"| {name} | {cells} | {best['end to end'] / best['torch']:.2f} |")
    stats = turbine.stats()
    print(f"kernels compiled: {stats['kernels_compiled']}, dispatches: {stats['dispatches']}")


if __name__ == "__main__":
    main()
