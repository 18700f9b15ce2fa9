"""The kernel plan: an op call run as one compiled IREE kernel, enqueued with fences.

Dense inputs (read as their buffers lie where those hold them in another order than row-major:
eager/kernel_orders.py), runtime scalars as 0-d buffers, fresh dense outputs (permuted back where
the kernel writes them in torch's order for them). While its kernel compiles in
the background, calls queue their launches on the device (eager/deferred.py), which takes the
kernel through ``await_kernel`` when it runs them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.config import config
from turbine.device import Buffer, BufferView, Device, join
from turbine.eager import deferred, executors, fallback, runtime
from turbine.eager.plans import STRUCTURES
from turbine.eager.scalars import scalar_view, wraps_its_operand
from turbine.eager.schema import schema_of
from turbine.eager.signature import Leaves
from turbine.eager.tensor import DenseLayout, DeviceTensor, inverse, permuted, torch_device
from turbine.eager.views import dense
from turbine.errors import CompileError, DeviceError, UnsupportedOpError, detached
from turbine.kernels_cache import CompilingKernel, Kernel, kernel_cache


class KernelPlan:
    """One compiled kernel: dense inputs, runtime scalars as 0-d buffers, fresh dense outputs.

    ``kernel`` may still be compiling (``compiling`` is its CompilingKernel): calls until then queue
    their launches (eager/deferred.py). Should the compile fail, ``failure`` says why and calls
    go to the fallback policy.
    """

    def __init__(
        self,
        func: Any,
        device: Device,
        kernel: Kernel | CompilingKernel,
        signature: tuple,
        scalar_dtypes: list,
        layouts: tuple,
        kind: str,
        orders: tuple | None = None,
        out_orders: tuple | None = None,
    ) -> None:
        self.func = func
        self.schema = schema_of(func)
        self.device = device
        self.compiling = kernel if isinstance(kernel, CompilingKernel) else None
        self.kernel = None if self.compiling else kernel
        self.failure: Exception | None = None
        #: Drops the plan from the plan cache (set by whoever stores it): see await_kernel.
        self.forget: Callable[[], None] = lambda: None
        self.signature = signature
        self.scalar_dtypes = scalar_dtypes
        self.wraps = wraps_its_operand(func, signature, len(scalar_dtypes))
        self.layouts = layouts  # (shape, dtype), or None, per output: as the kernel writes it
        self.outputs = [None if layout is None else DenseLayout(*layout) for layout in layouts]
        self.orders = orders  # per tensor input, the order the kernel reads its buffer in (None: row-major)
        self.out_orders = out_orders  # per output, the order the kernel writes it in
        self._backs = None if out_orders is None else [None if o is None else inverse(list(o)) for o in out_orders]
        self.torch_device = torch_device(device)
        self.kind = kind
        self.structure = STRUCTURES[kind]

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        if self.kernel is None or runtime.state.backlog:  # compiling, failed, or launches wait
            deferred.advance(self.device)
            if self._must_queue():
                return self._queue(leaves, args, kwargs)
            if self.failure is not None:
                return self._fallback(args, kwargs)
        views, waits = self.kernel_inputs(leaves.tensors)
        if leaves.scalars:
            views += self._scalar_views(leaves)
        results = iter(self.launch(views, join(waits)))
        torch_device = self.torch_device
        made = [None if layout is None else layout.make(*next(results), torch_device) for layout in self.outputs]
        return self.structure(made if self._backs is None else self._permuted_back(made))

    def kernel_inputs(self, tensors: list) -> tuple[list, list]:
        """The buffer views the kernel takes for ``tensors`` (a gather of a view whose buffer does
        not hold it as the kernel reads it), and the fences they wait on."""
        views, waits = [], []
        orders = self.orders
        for i, tensor in enumerate(tensors):
            if not tensor._dense:
                tensor = dense(tensor) if orders is None or orders[i] is None else permuted(tensor, orders[i])
            views.append(tensor.buffer_view())
            ready = tensor._storage.buffer.ready
            if ready is not None:
                waits.append(ready)
        return views, waits

    def kernel_result(self, index: int, result: DeviceTensor) -> DeviceTensor:
        """A result made elsewhere (the fallback's) as the kernel writes it (permuted into its order)."""
        order = None if self.out_orders is None else self.out_orders[index]
        return dense(result if order is None else permuted(result, order))

    def _fallback(self, args: tuple, kwargs: dict) -> Any:
        """The call on the fallback policy's executor, its results laid out as the kernel's
        would be (as a queued launch's fallback lays them out: deferred.py)."""
        result = fallback.run(self.func, args, kwargs, self.failure)
        if self._backs is None:
            return result
        if isinstance(result, torch.Tensor):
            return self._as_kernel_lays_out(0, result)
        return type(result)(self._as_kernel_lays_out(i, t) for i, t in enumerate(result))

    def _as_kernel_lays_out(self, index: int, result: Any) -> Any:
        back = self._backs[index] if index < len(self._backs) else None
        return result if back is None or result is None else permuted(self.kernel_result(index, result), back)

    def _permuted_back(self, made: list) -> list:
        """Results written in torch's order, as tensors with torch's sizes and strides."""
        return [t if t is None or back is None else permuted(t, back) for t, back in zip(made, self._backs)]

    def launch(self, views: list, wait: Any) -> list[tuple[Buffer, BufferView]]:
        """Enqueue the kernel (the deferred queue's launches come here too); a device's failure
        names the op. Under ``TURBINE_LAUNCH_BLOCKING=1`` the host waits for the kernel, so that a
        kernel that faults is named by its own op rather than by a later read."""
        try:
            results = self.kernel.launch(views, wait)
            if config.launch_blocking and results:
                self.device.settle(results[0][0].ready)
        except DeviceError as error:
            raise type(error)(f"{self.func}: {error}") from error
        return results

    @property
    def executor(self) -> executors.Executor | None:
        """Who runs its calls: IREE's kernel, or once the compile failed, the executor the calling
        thread's fallback policy chooses (None: the op raises)."""
        if self.failure is None:
            return executors.IREE
        return fallback.choose(self.func, self.device, runtime.state.fallback_policy)

    def await_kernel(self) -> None:
        """Wait for the kernel to compile; a failed compile becomes the plan's ``failure``.

        A compile that was stopped (Ctrl-C in a compile thread) makes the plan forget itself, so
        the next call of the op starts over, as it would after an interrupted compile on this thread.
        """
        compiling = self.compiling
        if compiling is None:
            return
        try:
            self.kernel = compiling.result()
        except (CompileError, UnsupportedOpError) as reason:
            self.failure = detached(reason)
        except BaseException:
            if compiling.done():
                self.forget()
            raise
        self.compiling = None

    def _must_queue(self) -> bool:
        """Whether this call's launch waits: its kernel is compiling, or launches wait before it.

        Takes the kernel once its compile has finished, or waits for it inside a queued launch
        (a fallback's ops run then and must not queue behind later launches).
        """
        if self.compiling is not None and (runtime.state.draining or self.compiling.done()):
            self.await_kernel()
        if self.failure is not None or runtime.state.draining:
            return False
        return self.compiling is not None or deferred.waiting(self.device)

    def _queue(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        """Queue the launch; the results are tensors over its pending buffers."""
        pending = deferred.defer(self, leaves, args, kwargs, self._scalar_views(leaves))
        torch_device = self.torch_device
        made = [None if layout is None else layout.make(buffer, None, torch_device) for layout, buffer in zip(self.outputs, pending)]
        return self.structure(made if self._backs is None else self._permuted_back(made))

    def _scalar_views(self, leaves: Leaves) -> list:
        device, wraps = self.device, self.wraps
        return [
            scalar_view(device, value, dtype, wraps and not i)
            for i, (value, dtype) in enumerate(zip(leaves.scalars, self.scalar_dtypes))
        ]

    def record(self) -> tuple | None:
        """None until the kernel has compiled, and for a kernel that failed: no later process
        should take such a plan without trying the kernel cache itself."""
        if self.kernel is None or self.failure is not None:
            return None
        digest = kernel_cache.digest(self.signature, self.device)
        return ("kernel", self.signature, digest, tuple(self.scalar_dtypes), self.layouts, self.kind, self.orders, self.out_orders)
