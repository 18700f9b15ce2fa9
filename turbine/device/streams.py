"""Streams and events in torch.cuda's shape, over IREE fences.

turbine orders work by data: each kernel waits for its inputs' fences, and buffers are never
written after they are made, so results are right in any order. A stream adds order without
data: a kernel launched while a stream is current also waits for that stream's previous kernel,
and an event recorded on a stream is reached when the stream's work so far is done. The default
stream (no stream current) keeps the data order alone; an event recorded there waits for all the
device's launched work, and a wait on the default stream is a host wait. Streams order IREE's
kernels; ops that torch's kernels run on the device (the vendor executor, the fallback) keep
the data order only.

Timing events are stamped by a watcher thread when their fence is reached (polled every 20 us:
IREE's Python API has no device timestamps), so ``elapsed_time`` is host time between the two
fences being reached, within some tens of microseconds.
"""

from __future__ import annotations

import threading
import time

import iree.runtime as rt

from turbine.device import registry
from turbine.device.device import Device
from turbine.device.views import join

_current = threading.local()
#: ``with stream:`` blocks open in any thread: while none is, launches skip looking for one.
entered = 0


class Stream:
    """An ordered queue of work on one device (``turbine.Stream()``, as ``torch.cuda.Stream()``)."""

    def __init__(self, device: Device, default: bool = False) -> None:
        self.device = device
        self.default = default
        #: The fence of the last kernel launched on it, or of what it was told to wait for.
        self.last: rt.HalFence | None = None

    def __repr__(self) -> str:
        kind = "default stream" if self.default else f"stream 0x{id(self):x}"
        return f"turbine.Stream({kind} on {self.device.name})"

    def ordered(self, wait: rt.HalFence) -> rt.HalFence:
        """A launch's wait fence, joined with the stream's last work."""
        return wait if self.last is None else join([wait, self.last])

    def wait_event(self, event: "Event") -> None:
        """Later work on this stream starts after the event's work (on the default stream: the
        host waits for it now)."""
        if event.fence is None:
            return
        if self.default:
            self.device.settle(event.fence)
        else:
            self.last = event.fence if self.last is None else join([self.last, event.fence])

    def wait_stream(self, other: "Stream") -> None:
        self.wait_event(other.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def done_fence(self) -> rt.HalFence | None:
        """The fence reached when the stream's work so far is done (None: nothing to wait for)."""
        if self.default:
            outstanding = self.device.outstanding()
            return join(outstanding) if outstanding else None
        return self.last

    def query(self) -> bool:
        fence = self.done_fence()
        return fence is None or bool(fence.wait(timeout=0))

    def synchronize(self) -> None:
        fence = self.done_fence()
        if fence is not None:
            self.device.settle(fence)

    def __enter__(self) -> "Stream":
        global entered
        _stack().append(self)
        entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        global entered
        stack = _stack()
        if stack and stack[-1] is self:
            stack.pop()
            entered -= 1


class Event:
    """A point in a stream's work (``turbine.Event()``, as ``torch.cuda.Event()``; ``blocking`` is
    accepted and ignored: waits poll or block as the device's driver needs, device.py)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        if interprocess:
            raise ValueError("turbine events cannot be shared between processes (interprocess=True)")
        self.enable_timing = enable_timing
        self.fence: rt.HalFence | None = None
        self.recorded = False
        self.reached_at: float | None = None
        self._device: Device | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Mark the work launched on ``stream`` (this thread's current stream of the current
        device) so far."""
        stream = stream or current_stream(registry.current())
        self.fence = stream.done_fence()
        self.recorded = True
        self._device = stream.device
        self.reached_at = None
        if self.enable_timing:
            _watch(self)

    def wait(self, stream: Stream | None = None) -> None:
        (stream or current_stream(registry.current())).wait_event(self)

    def query(self) -> bool:
        return self.fence is None or bool(self.fence.wait(timeout=0))

    def synchronize(self) -> None:
        if self.fence is not None and self._device is not None:
            self._device.settle(self.fence)

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds between this event's work being done and ``end``'s (both timing events)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("elapsed_time needs two events created with enable_timing=True")
        if not (self.recorded and end.recorded):
            raise RuntimeError("elapsed_time needs both events recorded first")
        for event in (self, end):
            event.synchronize()
            while event.reached_at is None:  # the watcher stamps it within its polling period
                time.sleep(_POLL_S)
        return (end.reached_at - self.reached_at) * 1e3


def _stack() -> list[Stream]:
    if not hasattr(_current, "stack"):
        _current.stack = []
    return _current.stack


_defaults: dict[int, Stream] = {}


def default_stream(device: Device) -> Stream:
    """The device's default stream (one object per device)."""
    return _defaults.setdefault(device.index, Stream(device, default=True))


def current_stream(device: Device) -> Stream:
    """This thread's current stream of ``device``: the innermost ``with stream:`` for it, else
    its default stream."""
    return current(device) or default_stream(device)


def current(device: Device) -> Stream | None:
    """The stream this thread launches ``device``'s kernels on, or None for the default stream."""
    stack = getattr(_current, "stack", None)
    if not stack:
        return None
    for stream in reversed(stack):
        if stream.device is device:
            return None if stream.default else stream
    return None


_POLL_S = 20e-6
_watched: list[Event] = []
_watch_lock = threading.Lock()
_watcher: threading.Thread | None = None


def _watch(event: Event) -> None:
    """Stamp ``event`` when its fence is reached (now, if it already is)."""
    global _watcher
    if event.query():
        event.reached_at = time.perf_counter()
        return
    with _watch_lock:
        _watched.append(event)
        if _watcher is None or not _watcher.is_alive():
            _watcher = threading.Thread(target=_stamp_until_done, name="turbine-event-timer", daemon=True)
            _watcher.start()


def _stamp_until_done() -> None:
    while True:
        with _watch_lock:
            if not _watched:
                return
            pending = list(_watched)
        now = time.perf_counter()
        for event in pending:
            try:
                reached = event.query()
            except RuntimeError:  # its work failed: synchronize raises that
                reached = True
            if reached:
                event.reached_at = now
                with _watch_lock:
                    _watched.remove(event)
        time.sleep(_POLL_S)


__all__ = ["Event", "Stream", "current", "current_stream", "default_stream"]
