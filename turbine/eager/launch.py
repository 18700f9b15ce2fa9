"""Enqueueing one kernel on a device: inputs' fences in, a fresh fence out, no host wait."""

from __future__ import annotations

from typing import Sequence

import iree.runtime as rt

from turbine.counters import counters
from turbine.device import Buffer, Device
from turbine.kernels_cache import Kernel

_NO_WAIT = rt.HalFence(0)
_VIEW = rt.HalBufferView


def join(fences: list[rt.HalFence]) -> rt.HalFence:
    """One fence that is reached when every fence in ``fences`` is."""
    if not fences:
        return _NO_WAIT
    if len(fences) == 1:
        return fences[0]
    return rt.HalFence.join(fences)


def launch(kernel: Kernel, device: Device, views: list, buffers: Sequence[Buffer]) -> list[tuple[Buffer, rt.HalBufferView]]:
    """Enqueue ``kernel`` on ``views`` once ``buffers`` are ready.

    Returns each result as a Buffer (ready when the kernel is done) with its buffer view.
    """
    return enqueue(kernel, device, views, join([b.ready for b in buffers if b.ready is not None]))


def enqueue(kernel: Kernel, device: Device, views: list, wait: rt.HalFence) -> list[tuple[Buffer, rt.HalBufferView]]:
    """``launch`` for a caller that has the inputs' fence already (the hot path of every op)."""
    results, ready = kernel.invoke(views, wait, device.new_fence())
    counters.dispatches += 1
    outputs = [results.get_as_object(index, _VIEW) for index in range(results.size)]
    return [(Buffer(device, view.get_buffer(), ready, view.byte_length), view) for view in outputs]
