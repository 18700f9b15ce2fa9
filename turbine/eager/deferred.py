"""Launches that wait for their kernel to compile, so a first forward pass compiles side by side.

Eager code issues one op at a time, and each new op's kernel costs about half a second to
compile. When a kernel plan's kernel is still compiling (``kernel_cache.start`` handed back a
CompilingKernel), its op does not wait: it returns tensors of the right sizes over PendingBuffers and
queues the launch here. The program goes on; the next new op's kernel starts compiling on
another compile thread, so up to ``TURBINE_COMPILE_JOBS`` kernels compile at once.

Rules that keep this invisible to the program:

- Order: once a launch waits on a device, every later kernel plan on that device queues behind
  it, and launches run in issue order. Buffers are never written after they are made, so the
  snapshot of each input buffer taken at issue time is what the launch reads.
- Reading a result waits: a PendingBuffer's ``hal`` or ``ready`` runs the queue up to its launch
  (blocking on compiles as needed). Downloads, DLPack, views and gathers all go through them.
- The queue moves by itself: every kernel op on the device first launches the queued ops whose
  kernels have compiled meanwhile.
- A compile that fails sends its launch to the fallback policy when the launch runs; with the
  ``error`` policy nothing is deferred, so the error comes from the op that caused it.
"""

from __future__ import annotations

import collections
import copy
import contextlib
from typing import Any

from turbine.config import config
from turbine.counters import counters
from turbine.device import Device, join, streams
from turbine.device.buffer import PendingBuffer
from turbine.eager import fallback, runtime
from turbine.eager.signature import rebuild
from turbine.eager.tensor import DeviceTensor, Storage
from turbine.errors import detached

def enabled() -> bool:
    """Whether new kernels compile in the background (``TURBINE_BACKGROUND_COMPILE``); not under
    the ``error`` policy, so the error comes from the op that caused it."""
    return config.background_compile and runtime.state.fallback_policy != "error"


def waiting(device: Device) -> bool:
    """Whether launches wait on ``device``."""
    return bool(runtime.state.device(device.index).queue)


def backlog() -> int:
    """Launches queued on any device of the runtime in use."""
    return runtime.state.backlog


def draining() -> bool:
    """Whether queued launches are running: ops issued then (by a fallback) must not queue again."""
    return runtime.state.draining > 0


class _Launch:
    """One queued kernel launch: the plan, snapshots of its inputs, and its pending results."""

    def __init__(self, plan: Any, leaves: Any, args: tuple, kwargs: dict, scalar_views: list) -> None:
        self.plan = plan
        self.device: Device = plan.device
        snapshots: dict[int, DeviceTensor] = {}

        def snapshot(tensor: DeviceTensor) -> DeviceTensor:
            """The tensor as it is now: a later in-place op swaps its storage's buffer, not this one's."""
            if id(tensor) not in snapshots:
                storage = tensor._storage
                frozen = Storage(storage.device, storage.dtype, storage.numel, storage.buffer)
                snapshots[id(tensor)] = DeviceTensor(frozen, tuple(tensor.shape), tensor.stride(), tensor.storage_offset())
            return snapshots[id(tensor)]

        self.tensors = [snapshot(t) for t in leaves.tensors]
        # The call itself, for the fallback should the compile fail (0-d CPU scalars copied too).
        self.call = rebuild(plan.schema, args, kwargs, snapshot, lambda v: v.clone() if hasattr(v, "clone") else v)
        self.scalar_views = scalar_views
        self.outputs = [
            None if layout is None else PendingBuffer(self.device, layout.numel * layout.dtype.itemsize, self.resolve)
            for layout in plan.outputs
        ]
        self.done = False
        #: The stream it was issued on (None: the default stream), which it launches on.
        self.stream = streams.current(self.device)
        #: The device queue it waits in (set by ``defer``).
        self.queue: collections.deque | None = None
        self.error: BaseException | None = None

    def resolve(self) -> None:
        """Run the queue up to this launch (a PendingBuffer of it was read)."""
        flush(self)
        if self.error is not None:
            raise copy.copy(self.error)

    def fail(self, error: BaseException) -> None:
        """The launch cannot run: reading any of its results raises ``error``."""
        error = self.error = detached(error)
        for pending in self.outputs:
            if pending is not None:
                pending.error = error

    def run(self) -> None:
        # An input whose own launch failed: this one fails with it, quietly; the error is raised
        # where a result is read, not in the middle of unrelated launches.
        for tensor in self.tensors:
            if tensor._storage.buffer.pending and tensor._storage.buffer.error is not None:
                self.fail(tensor._storage.buffer.error)
                return
        plan = self.plan
        plan.await_kernel()
        if plan.failure is not None:
            args, kwargs = self.call
            result = fallback.run(plan.func, tuple(args), kwargs, plan.failure)
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            for index, (pending, out, layout) in enumerate(zip(self.outputs, results, plan.outputs)):
                if pending is None:
                    continue
                out = plan.kernel_result(index, out)  # in the order the kernel would write it
                if tuple(out.shape) != layout.sizes:
                    raise RuntimeError(
                        f"{plan.func}: torch's kernel gave a result of shape {list(out.shape)} where its shape rule, "
                        f"which the tensor returned by the op was given, says {list(layout.sizes)}. Run with "
                        "TURBINE_BACKGROUND_COMPILE=0, and please report the op to turbine."
                    )
                buffer = out._storage.buffer
                pending.fill(buffer.hal, buffer.ready)
            return
        views, waits = plan.kernel_inputs(self.tensors)
        with self.stream or contextlib.nullcontext():
            results = iter(plan.launch(views + self.scalar_views, join(waits)))
        for pending in self.outputs:
            if pending is not None:
                buffer, _ = next(results)
                pending.fill(buffer.hal, buffer.ready)


def defer(plan: Any, leaves: Any, args: tuple, kwargs: dict, scalar_views: list) -> list[PendingBuffer | None]:
    """Queue a plan's launch; returns its pending result buffers (None where the op has no result)."""
    state = runtime.state
    launch = _Launch(plan, leaves, args, kwargs, scalar_views)
    with state.queue_lock:
        launch.queue = state.device(plan.device.index).queue
        launch.queue.append(launch)
        state.backlog += 1
    counters.deferred_launches += 1
    return launch.outputs


def advance(device: Device) -> None:
    """Launch the queued ops at the head of ``device``'s queue whose kernels have compiled.

    Not while a queued launch runs (its fallback issues ops): the launches after it may read
    its results, which it has not made yet.
    """
    state = runtime.state
    queue = state.device(device.index).queue
    while queue and not state.draining:
        compiling = queue[0].plan.compiling
        if compiling is not None and not compiling.done():
            return
        _run_next(state, queue)


def flush(upto: _Launch) -> None:
    """Run the queued launches of ``upto``'s device in order, waiting for compiles, until ``upto`` has run."""
    queue = upto.queue
    while queue and not upto.done:
        _run_next(runtime.state, queue)


def flush_all() -> None:
    """Run every queued launch on every device (tests use it so no launch outlives its test)."""
    state = runtime.state
    for index in state.device_indices():
        queue = state.device(index).queue
        while queue:
            _run_next(state, queue)


def _run_next(state: runtime.Runtime, queue: collections.deque) -> None:
    with state.queue_lock:
        if not queue:
            return
        launch = queue.popleft()
        state.backlog -= 1
        state.draining += 1
        try:
            launch.run()
        except Exception as error:  # raised where one of its results is read, not here
            launch.fail(error)
        except BaseException as error:  # Ctrl-C stops the program now
            launch.fail(error)
            raise
        finally:
            launch.done = True
            state.draining -= 1
