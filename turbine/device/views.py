"""Buffer views, element types and fences: what a kernel call takes, made without the caller importing IREE."""

from __future__ import annotations

from typing import Any, Sequence

import iree.runtime as rt

from turbine.device.buffer import Buffer

_ET = rt.HalElementType

#: IREE's element type for each dtype a device buffer can be read as, by dtype name.
ELEMENT_TYPES: dict[str, Any] = {
    "float32": _ET.FLOAT_32,
    "float16": _ET.FLOAT_16,
    "bfloat16": _ET.BFLOAT_16,
    "float64": _ET.FLOAT_64,
    "int8": _ET.SINT_8,
    "int16": _ET.SINT_16,
    "int32": _ET.SINT_32,
    "int64": _ET.SINT_64,
    "uint8": _ET.UINT_8,
    "bool": _ET.BOOL_8,
}

#: The fence that is reached from the start: a call waiting on it starts at once.
NO_WAIT = rt.HalFence(0)

BufferView = rt.HalBufferView


def view_of(buffer: Buffer, shape: Sequence[int], element_type: Any) -> rt.HalBufferView:
    """The buffer's first elements as a view of ``shape`` (what a kernel takes as an input)."""
    return rt.HalBufferView(buffer.hal, shape, element_type)


def sizes_carrier(view: rt.HalBufferView, sizes: Sequence[int], element_type: Any) -> rt.HalBufferView:
    """A view of shape ``[*sizes, 0]`` (no elements) over another view's buffer: a shape-generic
    kernel reads its sizes from such an input's dims, not from memory."""
    return rt.HalBufferView(view.get_buffer(), [*sizes, 0], element_type)


def join(fences: list[rt.HalFence]) -> rt.HalFence:
    """One fence that is reached when every fence in ``fences`` is."""
    if not fences:
        return NO_WAIT
    if len(fences) == 1:
        return fences[0]
    return rt.HalFence.join(fences)


def ready_fence(buffers: Sequence[Buffer]) -> rt.HalFence:
    """The fence reached when every one of ``buffers`` holds its values."""
    return join([b.ready for b in buffers if b.ready is not None])
