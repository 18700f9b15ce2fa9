"""IREE-facing layer: device names, opened devices, buffers and host transfers."""

import iree._runtime_libs._runtime as _iree_native

# Devices, kernels and the tensors a script still holds are alive when Python exits, and
# nanobind's exit check reports each of them as a "leak". They are not; silence the false alarm.
_iree_native.disable_leak_checker()

from turbine.device.buffer import Buffer, download, upload, upload_scalar
from turbine.device.device import Device
from turbine.device.dlpack import export_capsule, import_capsule
from turbine.device.registry import available, by_index, current, open_device, opened_devices
from turbine.device.views import ELEMENT_TYPES, NO_WAIT, BufferView, join, ready_fence, sizes_carrier, view_of

__all__ = [
    "Buffer",
    "BufferView",
    "Device",
    "ELEMENT_TYPES",
    "NO_WAIT",
    "export_capsule",
    "import_capsule",
    "join",
    "ready_fence",
    "sizes_carrier",
    "view_of",
    "available",
    "by_index",
    "current",
    "download",
    "open_device",
    "opened_devices",
    "upload",
    "upload_scalar",
]
