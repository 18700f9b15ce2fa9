"""The IREE executor: each signature compiled once into a kernel, run by kernel plans.

Its plan (eager/kernel_plan.py) holds the compiled kernel; a signature whose kernel does not
compile is remembered as failed (in the plan cache, and in the kernel cache on disk), and its
calls go to the fallback policy's executors.
"""

from __future__ import annotations

from typing import Any

from turbine.device import Device
from turbine.eager.executors.base import Executor


class IreeKernel(Executor):
    name = "iree"
    description = "a compiled IREE kernel"

    def cost(self, func: Any, device: Device | None) -> float | None:
        """The default: every op on every device is tried as a kernel first."""
        return 1.0
