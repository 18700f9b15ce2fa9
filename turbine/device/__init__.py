"""IREE-facing layer: device names, opened devices, buffers and host transfers."""

from turbine.device.buffer import Buffer, download, upload, upload_scalar
from turbine.device.device import Device
from turbine.device.registry import available, by_index, current, open_device, opened_devices

__all__ = [
    "Buffer",
    "Device",
    "available",
    "by_index",
    "current",
    "download",
    "open_device",
    "opened_devices",
    "upload",
    "upload_scalar",
]
