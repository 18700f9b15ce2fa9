"""Device buffers and the only two ways bytes cross between host and device.

A :class:`Buffer` is immutable once its ``ready`` fence is reached: turbine never writes into a
buffer a kernel produced; in-place ops make a new buffer and swap it in. That is why buffers can
be shared freely between storages and no write-after-read ordering is needed.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import iree.runtime as rt

from turbine.counters import counters
from turbine.device import failures

_HOST_VISIBLE = int(rt.MemoryType.HOST_VISIBLE)


class Buffer:
    """A HAL buffer on one device plus the fence that signals when its contents are valid."""

    __slots__ = ("device", "hal", "nbytes", "ready", "shared", "reader")

    #: Whether the buffer waits for a kernel that is still compiling (PendingBuffer).
    pending = False

    def __init__(
        self, device: "Device", hal: rt.HalBuffer, ready: rt.HalFence | None = None, nbytes: int | None = None  # noqa: F821
    ) -> None:
        self.device = device
        self.hal = hal
        self.nbytes = hal.byte_length() if nbytes is None else nbytes
        device.memory.held(self.nbytes)
        self.ready = ready
        #: Another library's view of the same memory, once one was made (eager's torch tensor
        #: through DLPack): kept with the buffer, since its contents never change.
        self.shared = None
        #: Who else read the memory (another library's streams: eager's TorchReads), else None;
        #: as the buffer dies, its ``retire()`` gives what tells when those reads are done.
        self.reader = None

    def __del__(self) -> None:
        self.device.memory.released(self.nbytes)
        if self.reader is not None:  # the memory goes back to IREE once those reads are done
            self.device.retired.keep(self.reader.retire(), (self.hal, self.shared))

    def wait(self) -> None:
        """Block the host until the buffer's producer finished (a failed kernel raises here)."""
        if self.ready is not None:
            self.device.settle(self.ready)
            self.ready = None


class PendingBuffer(Buffer):
    """The result buffer of a kernel launch that is still waiting for its kernel to compile.

    An eager op whose kernel is compiling returns at once (eager/deferred.py); its results hold
    PendingBuffers. Reading ``hal`` or ``ready`` first calls ``resolve``, which launches the
    waiting kernels in issue order up to this one and then ``fill``s the buffer, so code that was
    written for plain Buffers (downloads, DLPack, gathers) just waits for the launch.
    """

    __slots__ = ("resolve", "error", "_hal", "_ready")

    def __init__(self, device: "Device", nbytes: int, resolve: Callable[[], None]) -> None:  # noqa: F821
        self.device = device
        self.nbytes = nbytes
        device.memory.held(nbytes)
        self.resolve: Callable[[], None] | None = resolve
        self.shared = self.reader = None
        #: Why the launch failed (it stays pending, and ``resolve`` raises this), else None.
        self.error: BaseException | None = None
        self._hal = self._ready = None

    @property
    def pending(self) -> bool:
        return self.resolve is not None

    def fill(self, hal: rt.HalBuffer, ready: rt.HalFence | None) -> None:
        """The launch happened: this is the buffer, reached at ``ready``."""
        self._hal, self._ready, self.resolve = hal, ready, None

    @property
    def hal(self) -> rt.HalBuffer:
        if self.resolve is not None:
            self.resolve()
        return self._hal

    @property
    def ready(self) -> rt.HalFence | None:
        if self.resolve is not None:
            self.resolve()
        return self._ready

    @ready.setter
    def ready(self, fence: rt.HalFence | None) -> None:
        self._ready = fence


def _copy_in(device: "Device", array: np.ndarray) -> tuple[rt.HalBuffer, int]:  # noqa: F821
    """A new device buffer holding the array's bytes (an empty array gets a 1-byte buffer)."""
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if data.nbytes == 0:
        return device.allocate(1), 0
    device.require_usable()
    try:
        view = device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL,
            allowed_usage=rt.BufferUsage.DEFAULT,
            device=device.hal,
            buffer=data,
            element_type=rt.HalElementType.UINT_8,
        )
    except RuntimeError as error:
        raise failures.failure(device, error, f"copying {data.nbytes} bytes to it") from error
    return view.get_buffer(), data.nbytes


def upload(device: "Device", array: np.ndarray) -> Buffer:  # noqa: F821
    """Copy a host array into a new device buffer (one counted host transfer)."""
    hal, nbytes = _copy_in(device, array)
    if nbytes:
        counters.host_transfers += 1
        counters.host_transfer_bytes += nbytes
    return Buffer(device, hal)


def upload_scalar(device: "Device", array: np.ndarray) -> Buffer:  # noqa: F821
    """Copy a 0-d scalar argument to the device; counted apart from tensor data (``scalar_uploads``)."""
    hal, _ = _copy_in(device, array)
    counters.scalar_uploads += 1
    return Buffer(device, hal)


def download(buffer: Buffer, nbytes: int | None = None) -> np.ndarray:
    """Wait for the buffer and copy its first ``nbytes`` to a new host uint8 array (one counted
    transfer). Checks made on the device since the last read report first (``Device.expect``)."""
    buffer.device.raise_expected()
    out = _read(buffer, nbytes)
    counters.host_transfers += 1
    counters.host_transfer_bytes += out.nbytes
    return out


def read_report(buffer: Buffer) -> np.ndarray:
    """A check's report (a few bytes), counted apart from tensor data (``check_reports``)."""
    counters.check_reports += 1
    return _read(buffer, None)


def _read(buffer: Buffer, nbytes: int | None) -> np.ndarray:
    buffer.device.require_usable()  # its bytes may be anything once a kernel faulted
    buffer.wait()
    nbytes = buffer.nbytes if nbytes is None else nbytes
    if nbytes == 0:
        return np.empty(0, np.uint8)
    source = buffer.hal
    if not int(source.memory_type()) & _HOST_VISIBLE:
        source = buffer.device.staging_copy(source, nbytes)
    mapped = source.map()
    return np.array(mapped.asarray((source.byte_length(),), np.dtype(np.uint8))[:nbytes], copy=True)
