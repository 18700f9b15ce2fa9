"""A copy between two devices, turbine against torch in one run (issue 21's number).

    python benchmarks/two_gpus.py [--devices turbine:cuda0 turbine:cuda1] [--torch-devices cuda:0 cuda:1]
                                  [--mib 1024] [--repeats 5] [--out FILE]

Copies a ``--mib`` float32 tensor from the first device to the second (``x.to(second)``), waits
for it, and reports the median time and GB/s for torch and turbine, their ratio (turbine / torch
time), and how turbine copied (``device_copies``: device to device; ``host_transfers``: through
the host). On a CPU-only machine ``--devices turbine:cpu turbine:cpu1 --torch-devices cpu cpu``
checks that it runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import turbine


def _wait(device: str) -> None:
    if device.startswith("turbine"):
        turbine.synchronize(device)
    elif device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def _median_seconds(source: torch.Tensor, target: str, repeats: int) -> float:
    times = []
    for attempt in range(repeats + 1):
        _wait(str(source.device) if source.device.type != "turbine" else target)
        start = time.perf_counter()
        moved = source.to(target)
        _wait(target)
        if moved.device.type == "turbine":
            moved.sum().item()  # the copy's values reached the target
        if attempt:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs=2, default=["turbine:cuda0", "turbine:cuda1"])
    parser.add_argument("--torch-devices", nargs=2, default=["cuda:0", "cuda:1"])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    count = args.mib * 2**20 // 4
    host = torch.randn(count)
    theirs = _median_seconds(host.to(args.torch_devices[0]), args.torch_devices[1], args.repeats)
    source = host.to(args.devices[0])
    turbine.synchronize(args.devices[0])
    turbine.reset_stats()
    ours = _median_seconds(source, args.devices[1], args.repeats)
    stats = turbine.stats()
    how = f"device_copies {stats['device_copies']}, host_transfers {stats['host_transfers']}"
    gigabytes = count * 4 / 1e9
    lines = [
        f"a {args.mib} MiB float32 copy, {args.devices[0]} -> {args.devices[1]} against torch "
        f"{args.torch_devices[0]} -> {args.torch_devices[1]}; medians of {args.repeats} after a warm-up",
        "",
        "| copy | torch | turbine | ratio | how turbine copied |",
        "|---|---|---|---|---|",
        f"| {args.mib} MiB | {theirs * 1e3:.1f} ms ({gigabytes / theirs:.1f} GB/s) | {ours * 1e3:.1f} ms "
        f"({gigabytes / ours:.1f} GB/s) | {ours / theirs:.2f} | {how} |",
    ]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
