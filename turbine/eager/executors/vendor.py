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

from turbine.config import choice
from turbine.device import Device
from turbine.eager.executors.torch_kernel import TorchKernel, adopt, current_stream, finish_reads, raise_if_lost, shared_view, torch_device, usable
from turbine.eager.tensor import DeviceTensor

#: The values ``TURBINE_EXECUTORS`` takes.
MODES = ("auto", "iree", "all")


def mode() -> str:
    """``config.executors``, checked."""
    return choice("executors", MODES)


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
        argument: in-place ops reach it as their out-of-place twins); its results DeviceTensors."""
        result, stream = self.run_torch(func, args, kwargs, device)
        if isinstance(result, torch.Tensor):
            return adopt(result, device, stream)
        results = [adopt(r, device, stream) if isinstance(r, torch.Tensor) else r for r in result]
        return results if isinstance(result, list) else tuple(results)

    def run_torch(self, func: Any, args: tuple, kwargs: dict, device: Device) -> tuple[Any, tuple | None]:
        """:meth:`run`'s results as torch made them, and the key of the stream it made them on
        (in-place foreach ops put them in their targets' storages as they are: eager/foreach.py).
        The op's C++ callable (``_op``) is called straight, past OpOverload's Python ``__call__``."""
        return call_torch(func._op, args, kwargs, device, func)

    def claims(self, func: Any, device: Device | None, dtypes: list[torch.dtype]) -> bool:
        """Whether it competes for a call of ``func`` whose tensors have ``dtypes``."""
        return bool(dtypes) and self.cost(func, device) is not None


def call_torch(function: Any, args: tuple, kwargs: dict, device: Device, what: Any) -> tuple[Any, tuple | None]:
    """``function`` (an aten op's callable, or a torch function: eager/whole_calls.py) on torch
    tensors over the arguments' memory, on the calling thread's torch stream; its results as torch
    made them, and that stream's key. Arguments are mapped by hand, lists of tensors one level
    deep as aten's schemas have them: a tree walk (torch.utils._pytree) cost more than the op on a
    foreach call's lists. A lost GPU context is raised as such, naming ``what``."""
    inputs: list[DeviceTensor] = []
    usable(device)
    stream = current_stream(device)
    try:
        positional = [shared_view(a, stream) if type(a) is DeviceTensor else _down(a, inputs, device, stream) for a in args]
        if kwargs:
            result = function(*positional, **{k: _down(v, inputs, device, stream) for k, v in kwargs.items()})
        else:  # the usual call: no keyword mapping to build
            result = function(*positional)
    except Exception as error:
        raise_if_lost(error, device, what)
        raise
    if stream is not None:  # a GPU's: IREE's memory that torch read waits for torch's streams
        finish_reads([a for a in args if type(a) is DeviceTensor] + inputs, stream)
    return result, stream


def _down(value: Any, inputs: list[DeviceTensor], device: Device, stream: tuple[int, int, int] | None) -> Any:
    """An argument as torch's kernel takes it: a DeviceTensor as a torch tensor over its memory
    (noted in ``inputs``), a list of them item by item, the turbine device as torch's. A function
    of its own, not a closure: a closure that calls itself is a reference cycle, which kept every
    call's inputs (and their device memory) alive until Python's cycle collector ran."""
    if isinstance(value, DeviceTensor):  # a DeviceTensor subclass, or one inside a list
        inputs.append(value)
        return shared_view(value, stream)
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (list, tuple)) and value and any(isinstance(v, DeviceTensor) for v in value):
        return [_down(v, inputs, device, stream) for v in value]
    if isinstance(value, torch.device) and value.type == "turbine":
        return torch_device(device)
    return value


#: Arguments passed as they are with one check.
_SCALARS = frozenset((int, float, bool, type(None), torch.dtype))
