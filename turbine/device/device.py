"""An opened IREE device: driver, HAL device, VM instance, allocator and fences.

This layer knows nothing of torch ops; eager/ maps each Device to a ``torch.device("turbine", k)``.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Any, Callable

import iree.runtime as rt

from turbine.config import config
from turbine.device import cuda_context, failures
from turbine.device.buffer import read_report
from turbine.device.memory import Memory
from turbine.device.names import DeviceSpec
from turbine.device.retired import Retired
from turbine.errors import OutOfMemoryError


#: Options a device takes as keyword arguments when opened, with what each means.
DEVICE_OPTIONS = {
    "target": "compiler target architecture for this device's kernels (e.g. 'sm_80', 'gfx942', 'host')",
    "compiler_flags": "extra IREE compiler flags for this device's kernels (a list of strings)",
}

#: Drivers on which the host must not block on a fence before it is reached, so turbine polls
#: instead. IREE 3.13's CUDA driver links a blocked host wait's timepoints into the semaphores
#: from the waiting thread's stack, and its event code reads every linked timepoint as one of
#: its own (hal/drivers/cuda/event_semaphore.c): a kernel's call, which blocks in its
#: queue_alloca until its wait fence is reached, segfaulted when launches came in a burst.
POLLED_WAITS = {"cuda"}

#: Launch fences a device keeps before it drops those already reached (Device.launched): each
#: drop asks IREE about a fence, so they are dropped in batches.
_LAUNCHED_KEPT = 256

#: Check reports kept waiting for a read before the oldest are read anyway (``Device.expect``).
_EXPECTED_KEPT = 64

_instance_lock = threading.Lock()
_entered = threading.local()
_vm_instance: rt.VmInstance | None = None


def _reached(fence: rt.HalFence) -> bool:
    """Whether ``fence`` is reached, without blocking; a failed one counts as reached (its error
    comes from reading its results)."""
    try:
        return bool(fence.wait(timeout=0))
    except RuntimeError:
        return True


def _reached_soon(fence: rt.HalFence) -> bool:
    """Whether ``fence`` is reached within the CPU workers' spin time, asked without blocking.

    A blocked wait puts the thread to sleep and costs a wake-up; the small kernels of a chain
    (which wait for their inputs when they have dynamic dims) finish sooner than that."""
    deadline = time.perf_counter() + config.cpu_spin_us * 1e-6
    while True:
        if fence.wait(timeout=0):
            return True
        if time.perf_counter() >= deadline:
            return False


def vm_instance() -> rt.VmInstance:
    """The process's single VM instance, shared by every device and kernel."""
    global _vm_instance
    with _instance_lock:
        if _vm_instance is None:
            _vm_instance = rt.VmInstance()
        return _vm_instance


class Device:
    """One IREE device. ``index`` is its torch index: the k in ``torch.device("turbine", k)``."""

    def __init__(self, spec: DeviceSpec, hal: rt.HalDevice, index: int, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(DEVICE_OPTIONS))
        if unknown:
            known = ", ".join(f"{k} ({v})" for k, v in DEVICE_OPTIONS.items())
            raise TypeError(f"turbine device {spec.canonical} got unknown option(s) {unknown}; known options: {known}")
        self.spec = spec
        self.name = spec.canonical
        #: What turbine's buffers hold on it (memory.py).
        self.memory = Memory()
        #: Fences of launched work not yet seen reached, oldest first (``synchronize`` waits for them).
        self._launched: collections.deque[rt.HalFence] = collections.deque()
        #: Taken to drop fences from ``_launched`` (threads append to it without a lock).
        self._dropping = threading.Lock()
        self.kind = spec.kind
        self.driver = spec.driver
        self.index = index
        self.options = dict(options)
        self.hal = hal
        self.allocator = hal.allocator
        self.instance = vm_instance()
        self.hal_module = rt.create_hal_module(self.instance, hal)
        #: DLPack device type code: 1 is kDLCPU, 2 kDLCUDA, 10 kDLROCM, 7 kDLVulkan.
        self.dlpack_type = {"cpu": 1, "cuda": 2, "hip": 10, "vulkan": 7}[spec.kind]
        self._stack: list[Device] = []
        #: Whether waits on this device poll (POLLED_WAITS), kernel calls included.
        self.polls_waits = spec.kind in POLLED_WAITS
        #: Why the device can no longer run work (a kernel faulted), or None (device/failures.py).
        self.lost: str | None = None
        #: The CUDA context IREE made current when it opened the device (device/cuda_context.py).
        self._cuda_context = cuda_context.current() if spec.kind == "cuda" else None
        #: Memory dropped while another library's streams may still read it (device/retired.py).
        self.retired = Retired()
        #: Reports of checks made on the device, read at the next read from it (``expect``).
        self._expected: collections.deque[tuple[Any, Callable[[Any], BaseException | None]]] = collections.deque()


    def __repr__(self) -> str:
        return f"turbine.Device({self.name!r}, index={self.index})"

    def new_fence(self) -> rt.HalFence:
        """A fence an op signals when its results are ready.

        Each op gets its own semaphore: kernels may finish out of order on multi-queue drivers, and
        signalling one shared timeline out of order fails ("semaphore already signaled past").
        """
        return rt.HalFence.create_at(self.hal.create_semaphore(0), 1)

    def require_usable(self) -> None:
        """Raise DeviceLostError if a kernel faulted on this device (device/failures.py); else make
        its CUDA context current on the calling thread, which IREE's CUDA driver assumes when it
        allocates or loads a kernel (device/cuda_context.py). Every use of the device starts here."""
        if self.lost is not None:
            raise failures.lost(self)
        if self._cuda_context is not None:
            cuda_context.make_current(self._cuda_context)

    def launched(self, fence: rt.HalFence) -> None:
        """Note work the device will signal ``fence`` for, so that ``synchronize`` waits for it.
        Fences already reached are dropped as new ones come, so the list stays short."""
        launched = self._launched
        launched.append(fence)
        if len(launched) > _LAUNCHED_KEPT:
            with self._dropping:
                while launched and _reached(launched[0]):
                    launched.popleft()

    def expect(self, report: Any, check: Callable[[Any], BaseException | None]) -> None:
        """Keep a check's report (a small buffer a kernel writes, such as an index check's) until
        the next read from the device, which passes it to ``check`` (device/buffer.py: the bytes
        as numpy uint8) and raises the error it returns, as CUDA reports device-side asserts.
        Only the newest reports are kept waiting; older ones are read as new ones come."""
        self._expected.append((report, check))
        if len(self._expected) > _EXPECTED_KEPT:
            self.raise_expected(keep=_EXPECTED_KEPT // 2)

    def raise_expected(self, keep: int = 0) -> None:
        """Read the kept reports (all but the newest ``keep``); raise the first error one gives."""
        first = None
        while len(self._expected) > keep:
            try:
                report, check = self._expected.popleft()
            except IndexError:  # another thread read it
                break
            error = check(read_report(report))
            first = first or error
        if first is not None:
            raise first

    def outstanding(self) -> list[rt.HalFence]:
        """The fences of launched work not yet seen reached."""
        return list(self._launched)

    def synchronize(self) -> None:
        """Block the host until every piece of work launched on this device so far is done
        (raises, as reading its results would, if some failed or a check's report says so)."""
        launched = self._launched
        while launched:
            try:
                fence = launched[0]
            except IndexError:  # another thread dropped the last one
                break
            self.settle(fence)
            with self._dropping:
                if launched and launched[0] is fence:
                    launched.popleft()
        self.retired.let_go()
        self.raise_expected()

    def settle(self, fence: rt.HalFence) -> None:
        """Block the host until ``fence`` is reached (raises if its work failed); by polling where
        the driver cannot take a blocking host wait (POLLED_WAITS)."""
        self.require_usable()
        try:
            if not self.polls_waits:
                if not _reached_soon(fence):
                    fence.wait()
                return
            while not fence.wait(timeout=0):
                time.sleep(0)  # lets compile threads run meanwhile
        except RuntimeError as error:
            raise failures.failure(self, error, "while waiting for its work") from error

    def staging_copy(self, source: rt.HalBuffer, nbytes: int) -> rt.HalBuffer:
        """Copy device-local memory into a new host-visible buffer and wait for it. The copy is of
        the whole source (IREE's ``queue_copy`` takes no range), which may hold more than the
        ``nbytes`` wanted: a storage grown in place by ``resize_``."""
        self.require_usable()
        nbytes = max(nbytes, source.byte_length(), 1)
        try:
            staging = self.allocator.allocate_buffer(
                memory_type=rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE,
                allowed_usage=rt.BufferUsage.TRANSFER | rt.BufferUsage.MAPPING,
                allocation_size=nbytes,
            )
        except RuntimeError as error:
            raise failures.failure(self, error, f"allocating {nbytes} bytes of host memory to read into") from error
        done = self.new_fence()
        self.hal.queue_copy(source, staging, rt.HalFence(0), done)
        self.settle(done)
        return staging

    def allocate(self, nbytes: int) -> rt.HalBuffer:
        """An uninitialised device buffer (what ``torch.empty`` gives)."""
        self.require_usable()
        try:
            return self._allocate(nbytes)
        except OutOfMemoryError:
            with contextlib.suppress(RuntimeError):
                self.allocator.trim()  # hand the caching allocator's free blocks back, then try once more
            return self._allocate(nbytes)

    def _allocate(self, nbytes: int) -> rt.HalBuffer:
        try:
            return self.allocator.allocate_buffer(
                memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=max(nbytes, 1)
            )
        except RuntimeError as error:
            raise failures.failure(self, error, f"allocating {nbytes} bytes") from error

    # ``with turbine.device("turbine:cpu1"):`` makes this the device plain "turbine" means.
    def __enter__(self) -> "Device":
        _entered_stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        stack = _entered_stack()
        if stack and stack[-1] is self:
            stack.pop()


def _entered_stack() -> list[Device]:
    """This thread's devices entered with ``with device:``, innermost last."""
    if not hasattr(_entered, "stack"):
        _entered.stack = []
    return _entered.stack


def innermost_entered() -> Device | None:
    """The device of this thread's innermost ``with device:`` block, if any."""
    stack = _entered_stack()
    return stack[-1] if stack else None
