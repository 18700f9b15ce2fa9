"""Kernel cache benchmark: a small MLP's training steps with a cold cache, a warm disk, warm memory.

    python benchmarks/cache.py [--steps 5] [--device turbine:cpu]

"cold" runs in a new process on an empty cache directory (every kernel compiles, in the
background: ops return while their kernels compile side by side); "cold, one compile at a time"
does the same with TURBINE_BACKGROUND_COMPILE=0. As the cold process exits it starts a builder
that compiles its kernels into one bundle (kernels_cache/bundles.py); the benchmark waits for it.
"warm disk" runs in another new process on the directory the cold run filled; "warm memory"
repeats the workload inside that process; "warm disk, same process" runs it there once more after
forgetting every kernel and plan in memory (they come back from the bundle and the saved plans),
which leaves out a new process's first calls (torch's per-op setup, each kernel's first launch,
page faults). "warm disk, kernel by kernel" is a new process with TURBINE_CACHE_BUNDLES=0: what a
warm start costs without the bundle (as before the builder has finished); "warm disk, plans
built again" one with TURBINE_CACHE_PLANS=0 (eager/saved_plans.py). "warm disk, after another
model" runs in a new process that first trained another MLP (the same ops on other shapes) from
its own warm cache: turbine's and torch's code paths and the bundle are warm there, while this
model's plans and kernels still come from disk, which splits what a new process costs from what
reading this model from the cache costs.

Every process also runs the workload MEMORY_RUNS more times, warm memory in that process, and
each row's run is compared with the median of those: a ratio within one process. Warm rows are
the median of several new processes (--processes), since one run on a busy machine can be off by
2x. Target: warm disk compiles nothing and takes at most 1.5 times warm memory. Each process
first triggers torch's own lazy imports (see warm_torch_imports), and each timed run starts with
a garbage collection: otherwise the first run in a process pays for collecting the young objects
its imports left (a generation-1 collection of ~4400 objects, 1.2-2.2 ms here), which says nothing
about the cache.

For reference, the table is followed by what a new process's first run costs torch alone: the
same steps through a pass-through tensor subclass (each op goes through ``__torch_dispatch__`` to
torch's own CPU kernel; no turbine, no cache), first run against later ones in one new process.
That ratio is a floor under the warm-disk row's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: The MLP timed: layer widths and batch size.
MODEL = ((64, 128, 128, 10), 32)
#: Another MLP (the same ops on other shapes, so other kernels and plans), run first by the
#: "after another model" processes.
OTHER_MODEL = ((48, 96, 96, 8), 16)
#: Warm-memory runs per process; the median one is the process's yardstick (one run on this VM
#: can take 1.5x another in the same process).
MEMORY_RUNS = 5


def workload(device: str, steps: int, model_shape: tuple = MODEL) -> None:
    import torch

    import turbine  # noqa: F401  (registers the turbine device)

    (width_in, hidden_1, hidden_2, classes), batch = model_shape
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width_in, hidden_1),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden_1, hidden_2),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden_2, classes),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(batch, width_in, device=device)
    target = torch.randint(0, classes, (batch,), device=device)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
    loss.item()


def warm_torch_imports(device: str) -> None:
    """Trigger torch's own one-time lazy imports before timing: the optimizer imports torch._dynamo
    (about 1 s) and a Parameter of a tensor subclass imports torch.distributed.tensor (about 0.5 s).
    They cost the same with or without a kernel cache, so they are kept out of the comparison."""
    import torch

    workload("cpu", 1)
    torch.nn.Parameter(torch.empty(1, device=device))


def pass_through_phase(steps: int) -> None:
    """torch alone: the workload's math through a pass-through tensor subclass, timed in this new
    process; prints JSON [first run's seconds, the median warm run's]."""
    import torch
    from torch.utils._pytree import tree_map

    class PassThrough(torch.Tensor):
        @staticmethod
        def __new__(cls, elem: torch.Tensor) -> "PassThrough":
            wrapper = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype)
            wrapper.elem = elem
            return wrapper

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda value: value.elem if isinstance(value, PassThrough) else value  # noqa: E731
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
            return tree_map(lambda value: PassThrough(value) if type(value) is torch.Tensor else value, out)

    def run() -> float:
        gc.collect()
        start = time.perf_counter()
        torch.manual_seed(0)
        widths, batch = MODEL
        sizes = list(zip(widths, widths[1:]))
        params = [PassThrough(t).requires_grad_() for i, o in sizes for t in (torch.randn(o, i) * 0.1, torch.zeros(o))]
        optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
        x = PassThrough(torch.randn(batch, widths[0]))
        target = PassThrough(torch.randint(0, widths[-1], (batch,)))
        for _ in range(steps):
            optimizer.zero_grad()
            hidden = x
            for layer in range(3):
                hidden = torch.nn.functional.linear(hidden, params[2 * layer], params[2 * layer + 1])
                hidden = torch.relu(hidden) if layer < 2 else hidden
            loss = torch.nn.functional.cross_entropy(hidden, target)
            loss.backward()
            optimizer.step()
        loss.item()
        return time.perf_counter() - start

    warm_torch_imports("cpu")
    first = run()
    print(json.dumps([first, statistics.median_high(run() for _ in range(MEMORY_RUNS))]))


def phase(device: str, steps: int, forget: bool, other_first: bool) -> None:
    """One process: time the workload's first run, then its warm-memory runs (the median one is
    this process's yardstick); with ``forget``, once more after forgetting every kernel and plan
    in memory: the disk's cost without a new process's first calls. With ``other_first``, run
    OTHER_MODEL before timing. Prints JSON: the first, the median warm-memory and the forgotten run."""
    from turbine.eager import dispatch
    from turbine.kernels_cache import kernel_cache

    warm_torch_imports(device)
    if other_first:
        workload(device, steps, OTHER_MODEL)
    rows = [timed_run(device, steps)]
    memory = sorted((timed_run(device, steps) for _ in range(MEMORY_RUNS)), key=lambda row: row["seconds"])
    rows.append(memory[MEMORY_RUNS // 2])
    if forget:
        kernel_cache.clear_memory()
        dispatch.clear_plans()
        rows.append(timed_run(device, steps))
    print(json.dumps(rows))


def timed_run(device: str, steps: int) -> dict:
    """The workload's time and the kernel cache's counts in it."""
    import turbine

    turbine.reset_stats()
    gc.collect()
    start = time.perf_counter()
    workload(device, steps)
    seconds = time.perf_counter() - start
    stats = turbine.stats()
    return {
        "seconds": seconds,
        "compiled": stats["kernels_compiled"],
        "disk_hits": stats["cache_hits_disk"],
        "bundles": stats["bundles_loaded"],
        "plans": stats["plans_from_disk"],
    }


def run_phase(
    cache_dir: str, device: str, steps: int, forget: bool = False, other_first: bool = False, **env_vars: str
) -> list[dict]:
    env = dict(os.environ, TURBINE_CACHE_DIR=cache_dir, TURBINE_PROGRESS="0", **env_vars)
    command = [sys.executable, __file__, "--phase", "--device", device, "--steps", str(steps)]
    command += (["--forget"] if forget else []) + (["--other-first"] if other_first else [])
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def summary(runs: list[dict], yardsticks: list[dict]) -> dict:
    """A row of the table from runs of one kind, each with its process's median warm-memory run:
    the median run's counts and seconds, and the median of the runs' times over their own
    process's warm memory (a ratio within one process, so that a machine busier for one process
    than for another does not tilt it)."""
    ratios = sorted(run["seconds"] / yardstick["seconds"] for run, yardstick in zip(runs, yardsticks))
    row = dict(sorted(runs, key=lambda run: run["seconds"])[len(runs) // 2])
    row["ratio"] = statistics.median_high(ratios)
    row["ratios"] = ratios
    return row


def wait_for_bundle(cache_dir: str) -> float:
    """Wait for the bundle builder a cold process started as it exited; returns the seconds waited."""
    from turbine.kernels_cache.bundles import wait_for_builders

    start = time.perf_counter()
    if not wait_for_builders(cache_dir):
        print("the bundle builder did not finish in 10 minutes", file=sys.stderr)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="turbine:cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--processes", type=int, default=5, help="new processes per warm run; the table shows medians")
    parser.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--forget", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--other-first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pass-through", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        phase(args.device, args.steps, args.forget, args.other_first)
        return
    if args.pass_through:
        pass_through_phase(args.steps)
        return
    with tempfile.TemporaryDirectory(prefix="turbine-cache-bench-") as serial_dir:
        serial = run_phase(serial_dir, args.device, args.steps, TURBINE_BACKGROUND_COMPILE="0", TURBINE_CACHE_BUNDLES="0")
    by_kernel, no_plans, warm, after_other, torch_alone = [], [], [], [], []
    with (
        tempfile.TemporaryDirectory(prefix="turbine-cache-bench-") as cache_dir,
        tempfile.TemporaryDirectory(prefix="turbine-cache-bench-") as other_dir,
    ):
        cold = run_phase(cache_dir, args.device, args.steps)
        bundle_seconds = wait_for_bundle(cache_dir)
        run_phase(other_dir, args.device, args.steps, other_first=True)  # both models' kernels, in one bundle
        wait_for_bundle(other_dir)
        for _ in range(args.processes):  # alternating, so that every kind meets the same machine noise
            by_kernel.append(run_phase(cache_dir, args.device, args.steps, TURBINE_CACHE_BUNDLES="0"))
            no_plans.append(run_phase(cache_dir, args.device, args.steps, TURBINE_CACHE_PLANS="0"))
            after_other.append(run_phase(other_dir, args.device, args.steps, other_first=True))
            command = [sys.executable, __file__, "--pass-through", "--steps", str(args.steps)]
            torch_alone.append(json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1]))
            warm.append(run_phase(cache_dir, args.device, args.steps, forget=True))
    firsts, memories, forgottens = ([process[i] for process in warm] for i in range(3))
    warm_disk = summary(firsts, memories)
    warm_memory = summary(memories, memories)
    widths, batch = MODEL
    print(f"MLP {'-'.join(map(str, widths))}, batch {batch}, {args.steps} SGD steps (forward + backward) on {args.device}")
    print(
        f"seconds: each row's median run; warm rows run in {args.processes} new processes each. / warm memory: "
        "the median over those processes of each run's time over its own process's median warm-memory run"
    )
    print("| run | seconds | kernels compiled | disk hits | bundles loaded | plans from disk | / warm memory |")
    print("|---|---|---|---|---|---|---|")
    rows = [
        ("cold cache, one compile at a time", summary([serial[0]], [serial[1]])),
        ("cold cache", summary([cold[0]], [cold[1]])),
        ("warm disk, kernel by kernel (new process)", summary(*zip(*by_kernel))),
        ("warm disk, plans built again (new process)", summary(*zip(*no_plans))),
        ("warm disk (new process)", warm_disk),
        ("warm disk, after another model (new process)", summary(*zip(*after_other))),
        ("warm disk, same process (kernels and plans forgotten)", summary(forgottens, memories)),
        ("warm memory", warm_memory),
    ]
    for name, row in rows:
        cells = [f"{row['seconds']:.3f}", row["compiled"], row["disk_hits"], row["bundles"], row["plans"], f"{row['ratio']:.2f}"]
        print(f"| {name} | " + " | ".join(str(cell) for cell in cells) + " |")
    print(f"the cold process's bundle was ready {bundle_seconds:.1f} s after it exited")
    print(f"warm disk / warm memory in each process: {' '.join(f'{r:.2f}' for r in warm_disk['ratios'])}")
    alone = sorted(first / second for first, second in torch_alone)
    extra = statistics.median_high(first - second for first, second in torch_alone)
    print(
        f"torch alone (a pass-through tensor subclass, no turbine), first run / warm runs in a new process: median "
        f"{statistics.median_high(alone):.2f} ({' '.join(f'{r:.2f}' for r in alone)}); the first took {extra * 1e3:.1f} ms more"
    )
    extra = statistics.median_high(first["seconds"] - memory["seconds"] for first, memory in zip(firsts, memories))
    per_kernel = extra / max(1, warm_disk["disk_hits"])
    print(
        f"warm disk's run took {extra * 1e3:.1f} ms more than its process's warm memory (median): {per_kernel * 1e6:.0f} us "
        "per kernel read from disk, a new process's first calls included"
    )


if __name__ == "__main__":
    main()
