"""Sharing device buffers with torch through DLPack, both ways, without a copy where IREE allows."""

from __future__ import annotations

from typing import Any

import iree.runtime as rt

from turbine.device.buffer import Buffer
from turbine.device.device import Device
from turbine.device.views import NO_WAIT


def export_capsule(buffer: Buffer, count: int, element_type: Any) -> Any:
    """A DLPack capsule over the buffer's first ``count`` elements, once its producer finished.

    IREE's CUDA driver cannot export queue-ordered (pooled) allocations, which kernel results
    are: those are first copied into a plain allocation on the device, which it can export.
    """
    buffer.device.require_usable()
    buffer.wait()
    device = buffer.device
    flat = rt.HalBufferView(buffer.hal, [count], element_type)
    try:
        return device.hal.create_dlpack_capsule(flat, device.dlpack_type, device.spec.ordinal)
    except (ValueError, RuntimeError):
        plain = device.allocate(buffer.nbytes)
        done = device.new_fence()
        device.hal.queue_copy(buffer.hal, plain, NO_WAIT, done)
        device.settle(done)
        flat = rt.HalBufferView(plain, [count], element_type)
        return device.hal.create_dlpack_capsule(flat, device.dlpack_type, device.spec.ordinal)


def import_capsule(device: Device, capsule: Any) -> tuple[Buffer, rt.HalBufferView]:
    """A DLPack capsule's memory as a Buffer of ``device`` (no copy) and its buffer view;
    raises where IREE does not accept it (misaligned, an odd layout)."""
    device.require_usable()
    view = device.hal.from_dlpack_capsule(capsule)
    return Buffer(device, view.get_buffer()), view
