"""The floor of a Python tensor subclass: how close turbine's host work per op comes to the least
any design that dispatches each op in Python can do, on small workloads where the host decides.

    python benchmarks/floor.py [--device turbine:cpu] [--torch-device cpu] [--repeats 15] [--vendor]

Each workload runs three ways, taking turns: torch on ``--torch-device``; the same through
:class:`Floor`, a wrapper subclass whose ``__torch_dispatch__`` only unwraps, runs torch's op and
wraps (what turbine's DeviceTensor must do at the least); and turbine on ``--device``. The table
gives microseconds per step and the ratios: floor / torch is the price of the design, turbine /
floor what turbine adds to it. torch and the floor run as they do without turbine: turbine's
function mode (which every torch call in the process passes, eager/mode.py) is taken off while
they run, so its cost counts on turbine's side. ``--vendor`` runs every timed op on the vendor executor (torch's
kernels over the device memory, as the GPU chooses for most ops), with ``TURBINE_EXECUTORS=all``
on the CPU. ``benchmarks/gpu.py`` gives the same floor column at issue 17's sizes on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Callable

import torch


class Floor(torch.Tensor):
    """The least a Python tensor subclass can do: wrap a torch tensor and run each aten op on it.

    Its time over torch's is the floor of any design that, like turbine's DeviceTensor, sends
    every op through ``__torch_dispatch__`` in Python (the wrapper, the trip from torch's C++
    dispatcher into Python and back, autograd over wrapper tensors): the ``floor`` column."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> "Floor":
        kwargs = {"strides": inner.stride(), "dtype": inner.dtype, "device": inner.device}
        tensor = torch.Tensor._make_wrapper_subclass(cls, inner.shape, requires_grad=inner.requires_grad, **kwargs)
        tensor.inner = inner
        return tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        result = func(*[_inner(a) for a in args], **{k: _inner(v) for k, v in (kwargs or {}).items()})
        if isinstance(result, torch.Tensor):
            return Floor(result)
        if not isinstance(result, (tuple, list)):
            return result  # a number (item(), a size)
        return type(result)([Floor(r) if isinstance(r, torch.Tensor) else r for r in result])


def _inner(value: object) -> object:
    """An argument for torch's kernel: a Floor's tensor, lists of them item by item (aten's
    schemas nest no deeper; a pytree walk would cost more than the rest of the wrapper)."""
    if isinstance(value, Floor):
        return value.inner
    if isinstance(value, (list, tuple)):
        return [_inner(v) for v in value]
    return value


def on_floor(make: Callable[[str], tuple]) -> Callable[[str], tuple]:
    """A workload maker for the ``floor`` column: its tensors and module parameters made on
    ``device`` (torch's), then wrapped as :class:`Floor` tensors."""

    def made(device: str) -> tuple:
        original_to = torch.Tensor.to

        def to_floor(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            moved = original_to(self, *args, **kwargs)
            return moved if isinstance(moved, Floor) else Floor(moved)

        def module_to(module: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
            for owner in module.modules():
                for name, param in list(owner.named_parameters(recurse=False)):
                    setattr(owner, name, torch.nn.Parameter(Floor(original_to(param.detach(), device))))
            return module

        saved = torch.nn.Module.to
        torch.Tensor.to, torch.nn.Module.to = to_floor, module_to
        try:
            return make(device)
        finally:
            torch.Tensor.to, torch.nn.Module.to = original_to, saved

    return made


def chain(device: str) -> tuple[Callable[[], None], int]:
    """200 chained 256x256 adds (per op)."""
    x = torch.randn(256, 256).to(device)

    def run() -> None:
        y = x
        for _ in range(200):
            y = y + x

    return run, 200


def mlp_step(device: str) -> tuple[Callable[[], None], int]:
    """A small MLP's AdamW step (64-256-64, batch 8): about 24 ops, all host cost."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(8, 64).to(device)

    def run() -> None:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    return run, 1


def encoder_layer(device: str) -> tuple[Callable[[], None], int]:
    """A small TransformerEncoderLayer forward and backward (d_model 64, 4 heads, batch 2, sequence 8)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).to(device)
    x = torch.randn(2, 8, 64).to(device)

    def run() -> None:
        layer(x).sum().backward()

    return run, 1


WORKLOADS = {"chained 256x256 add, per op": chain, "small MLP AdamW step": mlp_step, "small TransformerEncoderLayer fwd+bwd": encoder_layer}


def wait(device: str) -> None:
    """Until the device's work is done: turbine's synchronize, or torch's."""
    import turbine

    if device.startswith("turbine"):
        turbine.synchronize(device)
    elif device.startswith("cuda"):
        torch.cuda.synchronize()


def as_alone(device: str) -> contextlib.AbstractContextManager:
    """Where work on ``device`` is timed: torch's devices (and the floor on them) as they run
    without turbine, its function mode (which every torch call in the process passes) taken off
    meanwhile; turbine's devices as they are."""
    from turbine.eager.mode import suspended

    return contextlib.nullcontext() if device.startswith("turbine") else suspended()


def _seconds(run: Callable[[], None], device: str, times: int = 5) -> float:
    """Seconds per call, over ``times`` calls waited for once."""
    with as_alone(device):
        wait(device)
        start = time.perf_counter()
        for _ in range(times):
            run()
        wait(device)
    return (time.perf_counter() - start) / times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="turbine:cpu")
    parser.add_argument("--torch-device", default="cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--vendor", action="store_true", help="every timed op on the vendor executor")
    args = parser.parse_args()
    if args.vendor and args.device.startswith("turbine:cpu"):
        os.environ["TURBINE_EXECUTORS"] = "all"  # read when turbine is imported, just below
    from turbine.eager.dispatch import plans
    from turbine.eager.timed_plan import TimedPlan
    from turbine.kernels_cache import kernel_cache

    print(f"turbine ({args.device}{', vendor' if args.vendor else ''}) against torch ({args.torch_device}) and the floor; "
          f"torch {torch.__version__}; medians of {args.repeats} runs, microseconds per step")
    print("| workload | torch | floor | turbine | floor / torch | turbine / torch | turbine / floor |")
    print("|---|---|---|---|---|---|---|")
    for name, make in WORKLOADS.items():
        reference, per = make(args.torch_device)
        floor, _ = on_floor(make)(args.torch_device)
        ours, _ = make(args.device)
        for _ in range(4):  # kernels compiled, executors timed
            ours()
            kernel_cache.wait_for_compiles()
            floor()
            reference()
        if args.vendor:
            for plan in plans().values():
                if isinstance(plan, TimedPlan):
                    plan.chosen = "vendor"
        times: dict[str, list[float]] = {"torch": [], "floor": [], "turbine": []}
        for _ in range(args.repeats):
            times["torch"].append(_seconds(reference, args.torch_device) / per)
            times["floor"].append(_seconds(floor, args.torch_device) / per)
            times["turbine"].append(_seconds(ours, args.device) / per)
        t, f, o = (statistics.median(times[k]) * 1e6 for k in ("torch", "floor", "turbine"))
        print(f"| {name} | {t:.1f} | {f:.1f} | {o:.1f} | {f / t:.2f} | {o / t:.2f} | {o / f:.2f} |", flush=True)


if __name__ == "__main__":
    main()
