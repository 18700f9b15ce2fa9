"""Enqueueing one kernel on a device: inputs' fences in, a fresh fence out, no host wait."""

from __future__ import annotations

from typing import Sequence

import iree.runtime as rt

from turbine.counters import counters
from turbine.device import Buffer, Device
from turbine.kernels_cache import Kernel

_NO_WAIT = rt.HalFence(0)
_VIEW = rt.HalBufferView


def wait_fence(buffers: Sequence[Buffer]) -> rt.HalFence:
    """One fence that is reached when every buffer is ready."""
    fences = [b.ready for b in buffers if b.ready is not None]
    if not fences:
        return _NO_WAIT
    if len(fences) == 1:
        return fences[0]
    return rt.HalFence.join(fences)


def launch(kernel: Kernel, device: Device, views: list, buffers: Sequence[Buffer]) -> list[tuple[Buffer, rt.HalBufferView]]:
    """Enqueue ``kernel`` on ``views`` once ``buffers`` are ready.

    Returns each result as a Buffer (ready when the kernel is done) with its buffer view.
    """
    results, ready = kernel.invoke(views, wait_fence(buffers), device.new_fence())
    counters.dispatches += 1
    outputs = []
    for index in range(results.size):
        view = results.get_as_object(index, _VIEW)
        outputs.append((Buffer(device, view.get_buffer(), ready, view.byte_length), view))
    return outputs
