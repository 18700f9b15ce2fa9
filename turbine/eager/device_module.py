"""What ``torch.turbine`` (and ``turbine``) offer ``torch.cuda`` users: which device is current,
waiting for a device, streams and events (device/streams.py), memory figures and seeds.

Devices are named as everywhere in turbine: ``None`` (the current device), a name
(``"turbine:cpu"``), a torch index, a ``torch.device("turbine", k)`` or a turbine Device.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch

from turbine.device import Device, open_device, opened_devices, streams
from turbine.device.registry import by_index, current, set_current
from turbine.eager import deferred

DeviceLike = Any  # None, str, int, torch.device or Device


def resolve(device: DeviceLike = None) -> Device:
    """The Device a device argument names (None: the current device)."""
    if device is None:
        return current()
    if isinstance(device, Device):
        return device
    if isinstance(device, int):
        return by_index(device)
    if isinstance(device, torch.device):
        if device.type != "turbine":
            raise ValueError(f"{device} is not a turbine device")
        return current() if device.index is None else by_index(device.index)
    if isinstance(device, str):
        return open_device(device)
    raise TypeError(f"expected a turbine device (a name, an index or a torch.device), got {type(device).__name__}")


def set_device(device: DeviceLike) -> None:
    """Make ``device`` what plain ``"turbine"`` means on this thread."""
    set_current(resolve(device))


def synchronize(device: DeviceLike = None) -> None:
    """Wait until every op launched on the device so far has finished: ops whose kernels were
    still compiling are launched first, and on a GPU the torch kernels turbine ran there (the
    vendor executor, the fallback) are waited for too."""
    target = resolve(device)
    deferred.flush_all()
    target.synchronize()
    if target.kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(target.spec.ordinal)
        target.retired.let_go()  # torch's reads are done: their memory goes back to IREE


class Stream(streams.Stream):
    """``turbine.Stream(device=None)``: a new stream on the device (priorities are not kept)."""

    def __init__(self, device: DeviceLike = None, priority: int = 0) -> None:
        super().__init__(resolve(device))


Event = streams.Event


def stream(chosen: streams.Stream | None) -> ContextManager:
    """``with turbine.stream(s):`` launches the block's kernels on ``s`` (None: no change)."""
    return contextlib.nullcontext() if chosen is None else chosen


def current_stream(device: DeviceLike = None) -> streams.Stream:
    return streams.current_stream(resolve(device))


def default_stream(device: DeviceLike = None) -> streams.Stream:
    return streams.default_stream(resolve(device))


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes of the device buffers turbine's tensors hold on the device now."""
    return resolve(device).memory.live


def max_memory_allocated(device: DeviceLike = None) -> int:
    """The most bytes they held since the device opened or ``reset_peak_memory_stats``."""
    return resolve(device).memory.peak


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    resolve(device).memory.reset_peak()


def memory_stats(device: DeviceLike = None) -> dict[str, int]:
    """``torch.cuda.memory_stats()``'s keys for what turbine counts, and IREE's own allocator
    statistics (``iree.*``: bytes its allocator handed out, freed and at its peak)."""
    target = resolve(device)
    stats = target.memory.stats()
    if target.allocator.has_statistics:
        stats.update({f"iree.{key}": value for key, value in target.allocator.statistics.items()})
    return stats


def empty_cache() -> None:
    """Give memory that IREE's allocators keep for reuse back to the system, on every device."""
    for device in opened_devices():
        device.allocator.trim()


def manual_seed(seed: int) -> None:
    """Seed the generator turbine's random ops draw from: torch's CPU generator (so seeds give
    torch's CPU numbers on every turbine device)."""
    torch.manual_seed(seed)


def seed() -> None:
    torch.seed()


def initial_seed() -> int:
    return torch.initial_seed()
