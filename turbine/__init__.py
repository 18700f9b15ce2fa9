"""turbine: an eager PyTorch device built on IREE.

    import torch, turbine
    x = torch.randn(64, 128, device="turbine:cpu")
    y = torch.relu(x @ x.T)          # each aten op runs as a compiled IREE kernel on the device
    print(y.cpu())                   # bytes reach the host only when read
"""

from __future__ import annotations

import logging
from typing import Any

from turbine import interrupts  # first: its exit hook must run after torch._dynamo's (interrupts.py)
from turbine.config import config, override
from turbine.counters import reset_stats, stats
from turbine.device import Device, available, open_device
from turbine.device.registry import current
from turbine.eager import DeviceTensor
from turbine.eager.device_module import (
    Event,
    Stream,
    current_stream,
    default_stream,
    empty_cache,
    manual_seed,
    max_memory_allocated,
    memory_allocated,
    memory_stats,
    reset_peak_memory_stats,
    set_device,
    stream,
    synchronize,
)
from turbine.eager.dynamic import mark_dynamic
from turbine.eager.fallback import TurbineFallbackWarning, fallback
from turbine.eager.graphs import graphed
from turbine.eager.mode import enable_in_thread
from turbine.eager.profiling import Profile, profile
from turbine.errors import (
    CompileError,
    CompileTimeout,
    CompilerCrash,
    DeviceNotFoundError,
    TurbineError,
    UnsupportedDtypeError,
    UnsupportedLayoutError,
    UnsupportedOpError,
)

logging.getLogger("turbine").addHandler(logging.NullHandler())
interrupts.install()

__version__ = "0.1.0"


def devices() -> list[str]:
    """Names of the turbine devices that can be opened on this machine."""
    return available()


def device(name: str = "turbine", **options: Any) -> Device:
    """Open (or get) a device by name; use it with ``with turbine.device(...)`` to make it current.

    Options apply when the device is first opened: ``target`` (compiler architecture) and
    ``compiler_flags`` (extra IREE compiler flags for its kernels).
    """
    return open_device(name, **options)


def current_device() -> Device:
    """The device plain ``"turbine"`` means here and now."""
    return current()


__all__ = [
    "CompileError",
    "CompileTimeout",
    "CompilerCrash",
    "Device",
    "DeviceNotFoundError",
    "DeviceTensor",
    "Event",
    "Stream",
    "TurbineError",
    "UnsupportedDtypeError",
    "UnsupportedLayoutError",
    "UnsupportedOpError",
    "TurbineFallbackWarning",
    "Profile",
    "config",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "devices",
    "empty_cache",
    "enable_in_thread",
    "fallback",
    "graphed",
    "manual_seed",
    "mark_dynamic",
    "max_memory_allocated",
    "memory_allocated",
    "memory_stats",
    "override",
    "profile",
    "reset_peak_memory_stats",
    "reset_stats",
    "set_device",
    "stats",
    "stream",
    "synchronize",
]
