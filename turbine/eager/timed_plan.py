"""The timed plan: a signature two executors can run (IREE's kernel, the vendor's), run by the faster.

The first call that finds the IREE kernel ready runs the call on each executor a few times and
keeps the faster for the signature, in the kernel cache beside the kernel (on disk), so later
processes do not time it again. Until the kernel has compiled, calls run on the vendor's
kernel rather than wait for the compile; a kernel that does not compile leaves the signature
to the vendor. ``TURBINE_EXECUTORS=iree`` turns the vendor off for every plan at once.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from turbine.config import config
from turbine.counters import counters
from turbine.device import Device
from turbine.eager import executors, fallback, runtime
from turbine.eager.executors.torch_kernel import TorchBuffer, shared_view
from turbine.eager.kernel_plan import KernelPlan
from turbine.eager.signature import Leaves
from turbine.eager.tensor import DeviceTensor
from turbine.kernels_cache import kernel_cache
from turbine.errors import DeviceError, DeviceLostError, detached

log = logging.getLogger("turbine")

#: Timed runs of each executor, after one warm-up run; the best counts.
RUNS = 3

#: Calls in each timed run (see ``_best``).
BURST = 4

#: How choices are timed now (kept with each choice): a choice timed another way is timed again.
#: 2: IREE's calls with their hand-overs to and from torch (``_iree_between_torch_kernels``).
TIMING = 2


class TimedPlan:
    """IREE's kernel plan (None where the kernel did not compile) and the vendor executor,
    with the choice between them: ``chosen`` is the executor's name, or None until timed."""

    def __init__(self, func: Any, device: Device, kernel_plan: KernelPlan | None, failure: Exception | None = None) -> None:
        self.func = func
        self.device = device
        self.kernel_plan = kernel_plan
        self.failure = None if failure is None else detached(failure)  # why IREE cannot run it, where it cannot
        self.chosen: str | None = None
        self.times: dict[str, float] = {}
        if kernel_plan is not None:
            kept = kernel_cache.choice(kernel_plan.signature, device)
            if kept is not None and kept.get("executor") in ("iree", "vendor") and kept.get("timing") == TIMING:
                self.chosen = kept["executor"]
                self.times = dict(kept.get("us") or {})
        else:
            self.chosen = executors.VENDOR.name

    @property
    def executor(self) -> executors.Executor | None:
        """Who runs its calls now (the IREE plan's executor until the vendor is chosen)."""
        if config.executors != "iree" and self.chosen == executors.VENDOR.name:
            return executors.VENDOR
        if self.kernel_plan is None:
            return fallback.choose(self.func, self.device, runtime.state.fallback_policy)
        return self.kernel_plan.executor

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        if config.executors == "iree":  # switched off after the plan was built
            return self._iree(leaves, args, kwargs)
        if self.chosen == "vendor":
            return self._vendor(leaves, args, kwargs)
        if self.chosen == "iree":
            return self._iree(leaves, args, kwargs)
        plan = self.kernel_plan
        if plan.compiling is not None and not plan.compiling.done():
            return self._vendor(leaves, args, kwargs)  # rather than wait for the compile
        plan.await_kernel()
        if plan.failure is not None:
            self._choose(leaves, "vendor", f"IREE's kernel did not compile: {fallback.first_line(plan.failure)}")
            return self._vendor(leaves, args, kwargs)
        return self._time(leaves, args, kwargs)

    def _iree(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        if self.kernel_plan is None:
            return fallback.run(self.func, args, kwargs, self.failure)
        return self.kernel_plan(leaves, args, kwargs)

    def _vendor(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        """The call on the vendor's kernel; where torch has none for it here (a dtype, a layout),
        IREE's kernel keeps the signature (or, without one, the fallback policy runs it)."""
        try:
            result = executors.VENDOR.run(self.func, args, kwargs, self.device)
        except (DeviceError, torch.OutOfMemoryError):
            raise  # a lost device, out of memory: not a call torch has no kernel for
        except Exception as error:
            self._choose(leaves, "iree", f"torch's kernel failed: {fallback.first_line(error)}")
            return self._iree(leaves, args, kwargs)
        counters.executors[executors.VENDOR.name] += 1
        return result

    def _time(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        """Run the call on both executors, keep the faster; returns the faster's results."""
        counters.executor_timings += 1
        launches = counters.dispatches
        iree_us, result = _best(lambda: self._iree_between_torch_kernels(leaves, args, kwargs))
        counters.dispatches = launches + 1  # the timing runs count as one op
        try:
            vendor_us, _ = _best(lambda: executors.VENDOR.run(self.func, args, kwargs, self.device))
        except DeviceLostError:
            raise  # not a call torch has no kernel for (IREE's result is no use either)
        except Exception as error:  # torch has no kernel for it here (a dtype, a layout), or no memory
            self._choose(leaves, "iree", f"torch's kernel failed: {fallback.first_line(error)}")
            return result
        self.times = {"iree": round(iree_us, 1), "vendor": round(vendor_us, 1)}
        self._choose(leaves, "vendor" if vendor_us < iree_us else "iree", "timed")
        return result

    def _iree_between_torch_kernels(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        """IREE's call as timed: as it runs among the vendor's calls, which run most ops on a GPU.
        Its inputs torch made are waited for on the host (as IREE's first read of one does), and
        its results are made torch tensors (a host wait for the kernel and, for IREE's pooled
        memory, a copy: device/dlpack.py). On the H200 these hand-overs cost more than many of the
        kernels IREE wins on alone, and a layer that switched between the two ran slower than
        either (eager/executors/torch_kernel.py)."""
        if any(isinstance(t._storage.buffer, TorchBuffer) for t in leaves.tensors) and self.device.kind == "cuda":
            torch.cuda.synchronize(self.device.spec.ordinal)
        result = self.kernel_plan(leaves, args, kwargs)
        for tensor in tree_leaves(result):
            if isinstance(tensor, DeviceTensor):
                shared_view(tensor)
        return result

    def _choose(self, leaves: Leaves, name: str, why: str) -> None:
        self.chosen = name
        call = _describe(self.func, leaves)
        log.info("turbine: %s on %s runs on %s (%s; us: %s)", call, self.device.name, name, why, self.times)
        if self.kernel_plan is not None:
            choice = {"op": call, "executor": name, "why": why, "us": self.times, "timing": TIMING}
            kernel_cache.keep_choice(self.kernel_plan.signature, self.device, choice)

    def record(self) -> tuple | None:
        """The kernel plan's record: a later process wraps it again (the choice is the kernel cache's)."""
        return None if self.kernel_plan is None else self.kernel_plan.record()


def _describe(func: Any, leaves: Leaves) -> str:
    """``aten.mm.default(float32[64, 64], float32[64, 64])``: the call a choice was made for."""
    inputs = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in leaves.tensors)
    return f"{func}({inputs})"


def _best(run: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``RUNS`` timings after a warm-up, in microseconds per call; and the last
    call's results. Each timing is a burst of ``BURST`` calls waited for at the end, as ops run
    in a program: an executor that returns before its kernel is done (torch's, on its stream) is
    charged its host cost per call, not one kernel's latency plus a wait per call."""
    best = math.inf
    result = None
    for attempt in range(RUNS + 1):
        start = time.perf_counter()
        for _ in range(BURST):
            result = run()
        for tensor in tree_leaves(result):
            if isinstance(tensor, DeviceTensor):
                tensor._storage.buffer.wait()
        if attempt:
            best = min(best, (time.perf_counter() - start) * 1e6 / BURST)
    return best, result
