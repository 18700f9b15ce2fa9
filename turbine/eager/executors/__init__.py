"""Executors: who runs a planned op (eager/executors/base.py says what one is).

- ``IREE``: a compiled IREE kernel, the default for every op;
- ``TORCH``: torch's kernel over the device memory (the ``device`` fallback policy);
- ``VENDOR``: the same for matmuls, convolutions and attention on GPUs, where it beats IREE's
  kernel (chosen by timing both: eager/timed_plan.py);
- ``HOST``: torch's CPU kernel on host copies (the ``host`` policy).

A fallback policy is a choice among them, made for an op IREE cannot run (:data:`BY_POLICY`).
"""

from turbine.eager.executors.base import Executor
from turbine.eager.executors.host import HostCopies
from turbine.eager.executors.iree import IreeKernel
from turbine.eager.executors.torch_kernel import TorchKernel
from turbine.eager.executors.vendor import VendorKernel

IREE = IreeKernel()
TORCH = TorchKernel()
HOST = HostCopies()
VENDOR = VendorKernel()

#: The executors each fallback policy may choose for an op IREE cannot run, cheapest first.
BY_POLICY: dict[str, tuple[Executor, ...]] = {"device": (TORCH, HOST), "host": (HOST,), "error": ()}

__all__ = ["BY_POLICY", "Executor", "HOST", "IREE", "TORCH", "VENDOR"]
