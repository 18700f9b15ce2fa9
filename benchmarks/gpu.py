"""turbine on a GPU against torch CUDA, in one run (issue 17's table).

    python benchmarks/gpu.py [--device turbine:cuda0] [--torch-device cuda] [--repeats 20] [--out FILE]

Workloads: a chain of small adds (per op), a 4096x4096 float32 add (bandwidth), 4096^3 matmuls in
float32, bfloat16 and float16 (TFLOP/s), a 3x3 convolution (64 -> 64 channels, 32x56x56), an MLP
training step (1024-4096-1024, batch 256, AdamW) and an ``nn.TransformerEncoderLayer`` forward and
backward (d_model 512, 8 heads, batch 16, sequence 128); the chain and the last two again with
turbine's side as ``turbine.graphed`` (one CUDA graph a call) against torch CUDA eager. Each is warmed up (its kernels compiled or
loaded, its executors chosen: ``warm_up``) and then timed ``--repeats`` times, torch and turbine taking turns; the table gives medians,
the ratio turbine / torch (time, or torch / turbine for rates, so above 1 is always turbine slower),
and which executors ran turbine's ops (``turbine.stats()['executors']``). For the workloads the
host's work per op decides, ``floor`` is the same workload on torch through the least possible
Python tensor subclass (``benchmarks/floor.py``), and ``floor ratio`` its time over torch's: a design
that dispatches each op in Python, turbine's included, has at least that much to do. Rates are taken over
bursts of ``BURST`` calls waited for once (before 2026-12-04, one call and a wait). torch's side is
timed as it runs without turbine (from 2026-12-05): turbine's function mode, which every torch call
in the process passes (about a microsecond each), is taken off while torch runs. Run it on the device
machine with torch CUDA; on a CPU-only machine ``--device turbine:cpu --torch-device cpu`` checks
that it runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

import turbine
from floor import as_alone, on_floor, wait
from turbine.kernels_cache import kernel_cache


def chain(device: str) -> tuple[Callable[[], list[torch.Tensor]], int]:
    """1000 chained 256x256 adds."""
    x = torch.randn(256, 256).to(device)

    def run() -> list[torch.Tensor]:
        y = x
        for _ in range(1000):
            y = y + x
        return [y]

    return run, 1000


#: Calls of a rate workload (bandwidth, TFLOP/s) issued before one wait: a rate is the device's
#: steady pace, as in a program that issues ops ahead of the device, not one call's latency
#: plus a host wait (the chained-add row measures the per-call cost).
BURST = 10


def burst(op: Callable[[], torch.Tensor]) -> tuple[Callable[[], list[torch.Tensor]], int]:
    """``op`` called ``BURST`` times in a row, its results kept until the wait."""
    return (lambda: [op() for _ in range(BURST)]), BURST


def big_add(device: str) -> tuple[Callable[[], list[torch.Tensor]], int]:
    a, b = torch.randn(4096, 4096).to(device), torch.randn(4096, 4096).to(device)
    return burst(lambda: a + b)


def matmul(dtype: torch.dtype) -> Callable[[str], tuple[Callable[[], list[torch.Tensor]], int]]:
    def make(device: str) -> tuple[Callable[[], list[torch.Tensor]], int]:
        a, b = (torch.randn(4096, 4096).to(device, dtype) for _ in range(2))
        return burst(lambda: a @ b)

    return make


def conv(device: str) -> tuple[Callable[[], list[torch.Tensor]], int]:
    x, w = torch.randn(32, 64, 56, 56).to(device), torch.randn(64, 64, 3, 3).to(device)
    return burst(lambda: torch.nn.functional.conv2d(x, w, padding=1))


def mlp_step(device: str, capturable: bool = False) -> tuple[Callable[[], list[torch.Tensor]], int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(device)
    # foreach=True is what torch CUDA picks by default; torch picks the single-tensor loop for a
    # tensor subclass such as turbine's, so it is asked for here on both sides.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True, capturable=capturable)
    x, target = torch.randn(256, 1024).to(device), torch.randn(256, 1024).to(device)

    def run() -> list[torch.Tensor]:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        return [loss, *model.parameters()]

    return run, 1


def encoder_layer(device: str) -> tuple[Callable[[], list[torch.Tensor]], int]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, batch_first=True, dropout=0.0).to(device)
    x = torch.randn(16, 128, 512).to(device).requires_grad_()

    def run() -> list[torch.Tensor]:
        layer.zero_grad()
        out = layer(x)
        out.sum().backward()
        return [out, x.grad, *(p.grad for p in layer.parameters())]

    return run, 1


def graphed(make: Callable[..., tuple[Callable[[], list[torch.Tensor]], int]]) -> Callable[[str], tuple]:
    """A workload maker whose turbine side runs as ``turbine.graphed`` (one CUDA graph a call,
    returning the first result; the optimizer ``capturable``, as a graph needs), torch's side
    as it is: torch CUDA eager, what the graph is measured against."""

    def made(device: str) -> tuple[Callable[[], list[torch.Tensor]], int]:
        if not device.startswith("turbine"):
            return make(device)
        run, calls = make(device, **({"capturable": True} if make is mlp_step else {}))
        step = turbine.graphed(lambda: run()[0])
        return (lambda: [step()]), calls

    return made


#: name -> (maker, unit, work per call for a rate: bytes or flops; None for a time)
WORKLOADS = {
    "chained 256x256 add, per op": (chain, "us", None),
    "4096x4096 float32 add": (big_add, "GB/s", 3 * 4096 * 4096 * 4),
    "4096^3 matmul float32": (matmul(torch.float32), "TFLOP/s", 2 * 4096**3),
    "4096^3 matmul bfloat16": (matmul(torch.bfloat16), "TFLOP/s", 2 * 4096**3),
    "4096^3 matmul float16": (matmul(torch.float16), "TFLOP/s", 2 * 4096**3),
    "conv2d 3x3 64->64, 32x56x56": (conv, "TFLOP/s", 2 * 32 * 64 * 56 * 56 * 64 * 9),
    "MLP 1024-4096-1024 AdamW step": (mlp_step, "ms", None),
    "TransformerEncoderLayer fwd+bwd": (encoder_layer, "ms", None),
    "chained 256x256 add, per op, turbine.graphed": (graphed(chain), "us", None),
    "MLP AdamW step, turbine.graphed": (graphed(mlp_step), "ms", None),
    "TransformerEncoderLayer fwd+bwd, turbine.graphed": (graphed(encoder_layer), "ms", None),
}


#: Workloads whose time is mostly the host's work per op: they also get the ``floor`` column.
HOST_BOUND = ("chained 256x256 add, per op", "MLP 1024-4096-1024 AdamW step", "TransformerEncoderLayer fwd+bwd")


def seconds(run: Callable[[], list[torch.Tensor]], device: str) -> float:
    """One run's seconds (its results kept until the wait); torch's side as it runs without turbine."""
    with as_alone(device):
        wait(device)
        start = time.perf_counter()
        results = run()  # noqa: F841  (alive until the wait)
        wait(device)
        return time.perf_counter() - start


def warm_up(run: Callable[[], list[torch.Tensor]], device: str) -> None:
    """Run until the workload's steady state: on turbine, until the kernels its first runs started
    compiling in the background have compiled and each signature's executor has been chosen (the
    first run with a compiled kernel times both executors: eager/timed_plan.py). Measured before
    that, the compiles shared the host's cores with the runs being timed."""
    for _ in range(2):
        seconds(run, device)
    if device.startswith("turbine"):
        for _ in range(3):
            kernel_cache.wait_for_compiles()
            seconds(run, device)


def value(median: float, unit: str, work: float | None, calls: int) -> float:
    if unit == "us":
        return median / calls * 1e6
    if unit == "ms":
        return median * 1e3
    return work * calls / median / (1e9 if unit == "GB/s" else 1e12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="turbine:cuda0")
    parser.add_argument("--torch-device", default="cuda")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", nargs="*", help="workload names (substrings) to run")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    lines = [
        f"turbine ({args.device}) against torch ({args.torch_device}), torch {torch.__version__}; "
        f"medians of {args.repeats} runs after a warm-up; ratio > 1: turbine slower",
        "",
        "| workload | torch | turbine | ratio | turbine's executors | floor | floor ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (make, unit, work) in WORKLOADS.items():
        if args.only and not any(part in name for part in args.only):
            continue
        reference, calls = make(args.torch_device)
        ours, _ = make(args.device)
        floor = on_floor(make)(args.torch_device)[0] if name in HOST_BOUND else None
        for run, device in ((reference, args.torch_device), (ours, args.device), (floor, args.torch_device)):
            if run is not None:
                warm_up(run, device)
        times: dict[str, list[float]] = {"torch": [], "turbine": [], "floor": []}
        executors: dict[str, int] = {}
        for _ in range(args.repeats):
            times["torch"].append(seconds(reference, args.torch_device))
            turbine.reset_stats()
            times["turbine"].append(seconds(ours, args.device))
            counts = turbine.stats()
            for k, v in [*counts["executors"].items(), ("graph replays", counts["graph_replays"])]:
                executors[k] = executors.get(k, 0) + v
            if floor is not None:
                times["floor"].append(seconds(floor, args.torch_device))
        executors = {k: v // args.repeats for k, v in executors.items() if v}
        theirs = value(statistics.median(times["torch"]), unit, work, calls)
        mine = value(statistics.median(times["turbine"]), unit, work, calls)
        ratio = theirs / mine if work is not None else mine / theirs
        row = f"| {name} | {theirs:.1f} {unit} | {mine:.1f} {unit} | {ratio:.2f} | {executors} |"
        if floor is not None:
            least = value(statistics.median(times["floor"]), unit, work, calls)
            row += f" {least:.1f} {unit} | {least / theirs:.2f} |"
        else:
            row += " | |"
        lines.append(row)
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
