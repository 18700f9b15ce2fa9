"""The vendor executor: torch's own GPU kernels (cuBLAS, cuDNN) over the device memory.

For the ops where a vendor library beats a generated kernel (matmuls, convolutions) torch's
CUDA kernels run on ``turbine:cuda*`` memory shared through DLPack, as the ``device`` fallback
does, but by choice rather than need: a call signature both it and IREE can run is timed on
both once (eager/timed_plan.py) and the faster keeps it, a choice the kernel cache keeps on disk.
Attention goes to torch's fused kernels by torch's own choice (eager/ops/attention.py).

``TURBINE_EXECUTORS`` (``turbine.config.executors``) says where it may claim ops: ``auto`` on
GPUs torch runs, ``iree`` nowhere, ``all`` on the CPU devices too (torch's CPU kernels).
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.config import config
from turbine.device import Device
from turbine.eager.executors.torch_kernel import TorchKernel, adopt, finish_reads, shared_view
from turbine.eager.tensor import DeviceTensor

aten = torch.ops.aten

#: The ops the vendor executor may claim, each with the ops of its gradient that must run on the
#: device as well: an op is claimed only when its backward does not leave the device.
GRADIENTS: dict[Any, tuple] = {
    aten.mm.default: (aten.mm.default,),
    aten.bmm.default: (aten.bmm.default,),
    aten.addmm.default: (aten.mm.default,),
    aten.baddbmm.default: (aten.bmm.default,),
    aten.convolution.default: (aten.convolution_backward.default,),
    aten.convolution_backward.default: (),
}

#: The values ``TURBINE_EXECUTORS`` takes.
MODES = ("auto", "iree", "all")

#: Element types whose matmuls and convolutions, and their gradients, torch's vendor kernels run.
_FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def mode() -> str:
    """``config.executors``, checked."""
    if config.executors not in MODES:
        raise ValueError(
            f"TURBINE_EXECUTORS (turbine.config.executors) is {config.executors!r}; choose one of {', '.join(MODES)}"
        )
    return config.executors


class VendorKernel(TorchKernel):
    name = "vendor"
    description = "torch's vendor kernel (cuBLAS, cuDNN, flash attention) over the device memory"

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
        gradient = GRADIENTS.get(func)
        if gradient is None or not self.runs_on(device):
            return None
        if any(op not in GRADIENTS for op in gradient):
            return None  # its backward would leave the vendor's kernels for an op it cannot run
        return 1.0

    def run(self, func: Any, args: tuple, kwargs: dict, device: Device | None) -> Any:
        """The op on torch tensors over the arguments' memory (its ops write no argument, and take
        tensors only as flat arguments: no tree walk)."""
        torch_args = [shared_view(a) if isinstance(a, DeviceTensor) else a for a in args]
        torch_kwargs = {k: shared_view(v) if isinstance(v, DeviceTensor) else v for k, v in kwargs.items()}
        result = func(*torch_args, **torch_kwargs)
        finish_reads([a for a in (*args, *kwargs.values()) if isinstance(a, DeviceTensor)])
        if isinstance(result, torch.Tensor):
            return adopt(result, device)
        return tuple(None if r is None else adopt(r, device) for r in result)

    def claims(self, func: Any, device: Device | None, dtypes: list[torch.dtype]) -> bool:
        """Whether it competes for a call of ``func`` whose tensors have ``dtypes``: floating
        types only (cuBLAS has no integer matmul, and integers have no gradient)."""
        return bool(dtypes) and all(d in _FLOATING for d in dtypes) and self.cost(func, device) is not None
