"""``pin_memory`` when turbine is torch's accelerator: batches pass through unpinned.

torch asks a backend's C++ hooks for a pinned-memory allocator, which a Python backend cannot
register, so ``tensor.pin_memory()`` raised NotImplementedError once turbine was imported, and
with it every ``DataLoader(pin_memory=True)`` (PyTorch's own MNIST example turns it on when an
accelerator is available). turbine copies to its devices from ordinary host memory, so pinning
would buy it nothing: DataLoader's pinning step hands turbine-bound batches on as they are, and
``Tensor.pin_memory()`` (seen by turbine's TorchFunctionMode, eager/mode.py) returns a copy in
ordinary memory. Pinning for torch CUDA is untouched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data._utils.pin_memory as _dataloader_pinning

_torch_pin_memory = _dataloader_pinning.pin_memory


def for_turbine(device: Any) -> bool:
    """Whether a pinning target means turbine: named so, or unnamed while turbine is torch's
    accelerator (DataLoader then pins for the current accelerator)."""
    if device is None or device == "":
        accelerator = torch.accelerator.current_accelerator(check_available=False)
        return accelerator is not None and accelerator.type == "turbine"
    return str(device).startswith("turbine")


def _pin_memory(data: Any, device: Any = None) -> Any:
    if for_turbine(device):
        return data
    return _torch_pin_memory(data, device)


def apply() -> None:
    """Route DataLoader's pinning step through turbine (once per process)."""
    _dataloader_pinning.pin_memory = _pin_memory
