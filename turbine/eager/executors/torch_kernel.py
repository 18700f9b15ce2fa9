"""The torch-kernel executor: torch's own kernel over the device memory, shared through DLPack.

torch's CPU kernels for ``turbine:cpu*``, torch's CUDA kernels for ``turbine:cuda*`` where torch
has CUDA; no byte is copied either way where IREE and torch accept each other's memory. It is
the ``device`` fallback policy's executor, and the shape a GPU vendor executor (cuBLAS, cuDNN)
takes: the same memory sharing, chosen by cost.
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.device import Device, export_capsule, import_capsule
from turbine.eager import host
from turbine.eager.dtypes import ELEMENT_TYPES, STORAGE_ONLY
from turbine.eager.executors.base import Executor
from turbine.eager.tensor import DeviceTensor, Storage
from turbine.eager.transfer import to_device


class TorchKernel(Executor):
    name = "torch"
    description = "torch's kernel over the device memory"

    def cost(self, func: Any, device: Device | None) -> float | None:
        """Torch runs on the CPU devices, and on CUDA ones where this torch has CUDA."""
        if device is None or device.kind == "cpu":
            return 2.0
        return 2.0 if device.kind == "cuda" and torch.cuda.is_available() else None

    def run(self, func: Any, args: tuple, kwargs: dict, device: Device | None) -> Any:
        """torch's kernel over shared memory; an argument the op writes is first cloned by torch (on
        the device) and the clone written back, so no buffer turbine handed out changes under it."""

        def shared(tensor: DeviceTensor, written: bool) -> torch.Tensor:
            result = shared_view(tensor)
            return result.clone() if written else result

        torch_device = torch.device("cuda", device.spec.ordinal) if device.kind == "cuda" else torch.device("cpu")
        return host.run_with_torch(func, args, kwargs, shared, lambda result: adopt(result, device), torch_device)


def shared_view(tensor: DeviceTensor) -> torch.Tensor:
    """A torch tensor (CPU or CUDA) over the same memory as ``tensor``, after its producer finished."""
    storage = tensor._storage
    parts = STORAGE_ONLY.get(storage.dtype)  # complex storage crosses DLPack as its real parts
    count = storage.numel * (2 if parts else 1)
    shared = torch.from_dlpack(export_capsule(storage.buffer, count, ELEMENT_TYPES[parts or storage.dtype]))
    if parts:
        shared = torch.view_as_complex(shared.view(-1, 2))
    return shared.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def adopt(result: torch.Tensor, device: Device) -> DeviceTensor:
    """A torch result as a DeviceTensor: shared through DLPack when IREE accepts it, else uploaded."""
    if result.device.type == "cuda":
        torch.cuda.current_stream(result.device).synchronize()  # IREE reads it on its own streams
    dense = result.resolve_conj().resolve_neg().contiguous()  # torch's lazy conj/neg bits, made real
    parts = dense.dtype in STORAGE_ONLY
    try:
        buffer, view = import_capsule(device, torch.utils.dlpack.to_dlpack(torch.view_as_real(dense) if parts else dense))
    except Exception:  # misaligned or an odd layout: copy it (a counted transfer)
        return to_device(dense.cpu(), device)
    tensor = DeviceTensor(Storage(device, dense.dtype, dense.numel(), buffer), tuple(dense.shape))
    if not parts:
        tensor._view_cache = (buffer, view)
    return tensor
