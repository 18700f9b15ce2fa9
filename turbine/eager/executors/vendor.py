"""The vendor executor: torch's own GPU kernels (cuBLAS, cuDNN, its elementwise kernels) over the
device memory.

IREE's CUDA runtime records a command buffer (a CUDA graph) for every call and its generated
elementwise kernels reach a quarter to a half of the H200's bandwidth (benchmarks/results/), so on
a GPU torch's own kernels are often the faster way to run an op on turbine's memory. They run over
memory shared through DLPack, as the ``device`` fallback does, but by choice rather than need:
a call signature both it and IREE can run is timed on both once (eager/timed_plan.py) and the
faster keeps it, a choice the kernel cache keeps on disk.

Every op IREE would run as a kernel competes: its backward ops come through dispatch in their
turn and are claimed the same way, so backward stays on the device whichever executor wins (and
what torch has no kernel for here, a dtype or a layout, is found by the timing and left to IREE).
Attention goes to torch's fused kernels by torch's own choice (eager/ops/attention.py).

``TURBINE_EXECUTORS`` (``turbine.config.executors``) says where it may claim ops: ``auto`` on
GPUs torch runs, ``iree`` nowhere, ``all`` on the CPU devices too (torch's CPU kernels).
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.config import config
from turbine.device import Device
from turbine.eager import host
from turbine.eager.executors.torch_kernel import TorchKernel, adopt, finish_reads, shared_view, torch_device
from turbine.eager.tensor import DeviceTensor

#: The values ``TURBINE_EXECUTORS`` takes.
MODES = ("auto", "iree", "all")


def mode() -> str:
    """``config.executors``, checked."""
    if config.executors not in MODES:
        raise ValueError(
            f"TURBINE_EXECUTORS (turbine.config.executors) is {config.executors!r}; choose one of {', '.join(MODES)}"
        )
    return config.executors


class VendorKernel(TorchKernel):
    name = "vendor"
    description = "torch's own kernel (cuBLAS, cuDNN, its elementwise kernels) over the device memory, where it is faster"

    def runs_on(self, device: Device | None) -> bool:
        """Whether the executors switch lets it claim ops on ``device`` and torch runs there."""
        chosen = mode()
        if device is None or chosen == "iree":
            return False
        if device.kind == "cuda":
            return torch.cuda.is_available()
        return chosen == "all" and device.kind == "cpu"

    def cost(self, func: Any, device: Device | None) -> float | None:
        """As IREE's kernel (1): which of the two runs a signature is decided by timing both."""
        return 1.0 if self.runs_on(device) else None

    def run(self, func: Any, args: tuple, kwargs: dict, device: Device | None) -> Any:
        """The op on torch tensors over the arguments' memory (the ops it competes for write no
        argument: in-place ops reach it as their out-of-place twins)."""
        if _flat(args) and (not kwargs or _flat(kwargs.values())):
            inputs = [a for a in args if isinstance(a, DeviceTensor)]
            torch_args = [shared_view(a) if isinstance(a, DeviceTensor) else a for a in args]
            if kwargs:
                inputs += [v for v in kwargs.values() if isinstance(v, DeviceTensor)]
                kwargs = {k: shared_view(v) if isinstance(v, DeviceTensor) else v for k, v in kwargs.items()}
            result = func(*torch_args, **kwargs)
            finish_reads(inputs)
            if isinstance(result, torch.Tensor):
                return adopt(result, device)
            return tuple(adopt(r, device) if isinstance(r, torch.Tensor) else r for r in result)
        result = host.run_with_torch(func, args, kwargs, lambda t, _: shared_view(t), lambda r: adopt(r, device), torch_device(device))
        finish_reads(host.device_tensors(args, kwargs))
        return result

    def claims(self, func: Any, device: Device | None, dtypes: list[torch.dtype]) -> bool:
        """Whether it competes for a call of ``func`` whose tensors have ``dtypes``."""
        return bool(dtypes) and self.cost(func, device) is not None


def _flat(values: Any) -> bool:
    """Whether no argument is a list of tensors or a device that torch must be told of (so
    that a tree walk over the arguments is not needed)."""
    for value in values:
        if isinstance(value, torch.device):
            return False
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return False
    return True
