"""Which devices are open, their torch indices, and the current device.

Devices open lazily on first use of their name and stay open for the process; the k-th device
opened is ``torch.device("turbine", k)``.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import threading
from typing import Any

import iree.runtime as rt

from turbine.config import config
from turbine.device.device import Device, innermost_entered
from turbine.device.names import DRIVERS, DeviceSpec, parse
from turbine.errors import DeviceNotFoundError

log = logging.getLogger("turbine")

#: The most devices one process opens (torch sizes per-device tables from a fixed count).
MAX_DEVICES = 64

_lock = threading.RLock()
_by_name: dict[str, Device] = {}
_by_index: list[Device] = []
_drivers: dict[str, rt.HalDriver] = {}


def _driver(name: str) -> rt.HalDriver:
    if name not in _drivers:
        if not _drivers:
            _apply_runtime_flags()
        _drivers[name] = rt.get_driver(name)
    return _drivers[name]


def runtime_flags() -> list[str]:
    """The IREE runtime flags turbine sets: ``config.runtime_flags``, plus the CPU workers' count and
    spin time where those flags do not set them."""
    flags = list(config.runtime_flags)
    if config.cpu_workers > 0 and not any(f.startswith("--task_topology") for f in flags):
        flags.append(f"--task_topology_group_count={config.cpu_workers}")
    if not any(f.startswith("--task_worker_spin_us") for f in flags):
        flags.append(f"--task_worker_spin_us={config.cpu_spin_us}")
    return flags


def _apply_runtime_flags() -> None:
    """IREE reads its runtime flags when a driver is created, so they are set once, before the first."""
    flags = runtime_flags()
    if not flags:
        return
    try:
        rt.flags.parse_flags(*flags)
    except Exception as error:
        raise ValueError(
            f"IREE rejected the runtime flags {flags} ({error}); check TURBINE_RUNTIME_FLAGS, TURBINE_CPU_WORKERS and TURBINE_CPU_SPIN_US."
        ) from None
    log.info("IREE runtime flags: %s", " ".join(flags))


def _gpu_count(driver: str) -> int:
    """How many devices a GPU driver reports here (0 when the driver or its library is missing)."""
    if driver not in rt.query_available_drivers():
        return 0
    try:
        return len(_driver(driver).query_available_devices())
    except Exception:  # a missing CUDA/HIP/Vulkan library raises from the driver factory
        return 0


def available() -> list[str]:
    """Names of the devices that can be opened on this machine."""
    names = ["turbine:cpu", "turbine:cpu:sync"]
    for kind in ("cuda", "hip", "vulkan"):
        names += [f"turbine:{kind}{i}" for i in range(_gpu_count(DRIVERS[kind]))]
    return names


def _create_hal(spec: DeviceSpec) -> rt.HalDevice:
    if spec.kind == "cpu":
        return _driver(spec.driver).create_default_device()
    count = _gpu_count(spec.driver)
    if spec.ordinal >= count:
        raise DeviceNotFoundError(
            f"Cannot open {spec.canonical}: the IREE '{spec.driver}' driver "
            + (f"reports {count} device(s)" if count else "is not usable on this machine")
            + f". Devices that can be opened: {', '.join(available())}."
        )
    info = _driver(spec.driver).query_available_devices()[spec.ordinal]
    return _driver(spec.driver).create_device(info["device_id"])


def open_device(name: str, **options: Any) -> Device:
    """The Device for a name, opening it on first use. Options apply when the device is first opened."""
    spec = parse(name)
    if spec.kind is None:
        return by_index(spec.torch_index) if spec.torch_index is not None else current()
    with _lock:
        device = _by_name.get(spec.canonical)
        if device is None:
            if len(_by_index) >= MAX_DEVICES:
                raise DeviceNotFoundError(
                    f"Cannot open {spec.canonical}: a process opens at most {MAX_DEVICES} turbine devices."
                )
            hal = _create_hal(spec)
            device = Device(spec, hal, len(_by_index), options)
            _by_name[spec.canonical] = device
            _by_index.append(device)
            log.info("opened %s (IREE driver %s) as torch index %d", device.name, spec.driver, device.index)
        elif options and options != device.options:
            raise ValueError(
                f"{device.name} is already open with options {device.options}; options apply only when a device "
                "is first opened (restart the process to change them)."
            )
        return device


def by_index(index: int) -> Device:
    """The device behind ``torch.device("turbine", index)``; index 0 before any device is open
    opens the default device (which becomes index 0), as code written for ``torch.accelerator``
    names ``turbine:0`` before it has run anything."""
    with _lock:
        if index == 0 and not _by_index:
            return open_device(config.default_device)
        if 0 <= index < len(_by_index):
            return _by_index[index]
    opened = ", ".join(f"{d.index}={d.name}" for d in opened_devices()) or "none"
    raise DeviceNotFoundError(
        f"turbine:{index} is not an opened turbine device (opened: {opened}). Use a name such as 'turbine:cpu'."
    )


def opened_devices() -> list[Device]:
    with _lock:
        return list(_by_index)


def current() -> Device:
    """The device plain ``"turbine"`` means: the innermost ``with device``, else the thread's
    ``set_current`` device, else ``config.default_device``."""
    return innermost_entered() or getattr(_chosen, "device", None) or open_device(config.default_device)


_chosen = threading.local()


def set_current(device: Device) -> None:
    """Make ``device`` what plain ``"turbine"`` means on this thread outside ``with device:``
    blocks (``torch.turbine.set_device``, as ``torch.cuda.set_device`` is per thread)."""
    _chosen.device = device


def _keep_devices_past_exit() -> None:
    """Never release the opened devices' HAL objects: the OS takes their memory back at exit.

    At interpreter exit Python frees what is left in whatever order its last collection finds
    it. A device buffer still alive then (in a reference cycle of the user's, or kept by an
    exception) could be released after its HAL device and allocator, into freed memory: the
    process ended with a segmentation fault (status 139) after an ordinary run. torch leaves its
    CUDA allocator to the OS at exit for the same reason.
    """
    for device in _by_index:
        for handle in (device.hal, device.allocator, device.instance):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))


atexit.register(_keep_devices_past_exit)
