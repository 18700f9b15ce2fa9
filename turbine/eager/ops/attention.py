"""Scaled dot-product attention as torch's fused kernels (flash, memory-efficient, cuDNN) on GPUs.

torch chooses a fused attention kernel only for the devices it was built with (the choice is a
C++ dispatch stub that a Python backend cannot fill), so on a turbine device
``F.scaled_dot_product_attention`` is torch's math: two batched matmuls, a softmax and the whole
attention matrix in memory. Where the vendor executor runs (executors/vendor.py), the call runs
instead as torch's own ``scaled_dot_product_attention`` over the same memory, which picks its
kernel as it does for torch CUDA; its backward is torch's backward of that call, on the device
too. Elsewhere, or with ``TURBINE_EXECUTORS=iree``, it stays torch's math on turbine's kernels.

Two ways in: with autograd, a kernel registered for turbine's autograd key (torch's composite
would decompose the call before turbine saw it); without (``torch.inference_mode``), the op
reaches dispatch whole and its registry handler runs it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from turbine.counters import counters
from turbine.device import Device
from turbine.eager import executors
from turbine.eager.executors.torch_kernel import adopt, finish_reads, shared_view
from turbine.eager.host import device_of
from turbine.eager.registry import declare
from turbine.eager.tensor import DeviceTensor

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_POSITIONAL = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_FLOATING = (torch.float32, torch.float16, torch.bfloat16)


def _bound(args: tuple, kwargs: dict) -> tuple[list, dict]:
    """The call as (query, key, value, attn_mask) and its other arguments by name."""
    named = dict(zip(_POSITIONAL, args), **kwargs)
    tensors = [named.pop(name, None) for name in _POSITIONAL[:4]]
    return tensors, named


def _vendor_device(tensors: list) -> Device | None:
    """The device whose vendor executor runs this call, or None (then torch's math runs it)."""
    present = [t for t in tensors if t is not None]
    if not all(isinstance(t, DeviceTensor) for t in present):
        return None  # a mix of devices: the math path raises torch's error
    device = device_of(tuple(present), {})
    if device is None or any(t._storage.device is not device for t in present):
        return None
    if any(t.dtype not in _FLOATING for t in tensors[:3]) or not executors.VENDOR.runs_on(device):
        return None
    return device


class _VendorAttention(torch.autograd.Function):
    """torch's attention over the device memory; backward through torch's graph of that call."""

    @staticmethod
    def forward(ctx: Any, device: Device, options: dict, *tensors: DeviceTensor | None) -> DeviceTensor:
        stand_ins = [None if t is None else shared_view(t).detach().requires_grad_(t.requires_grad) for t in tensors]
        with torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(*stand_ins, **options)
        finish_reads([t for t in tensors if t is not None])
        ctx.device = device
        ctx.graph = (stand_ins, out)
        ctx.inputs = [t for t in tensors if t is not None]
        counters.executors[executors.VENDOR.name] += 1
        return adopt(out.detach(), device)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: DeviceTensor) -> tuple:
        stand_ins, out = ctx.graph
        wanted = [s for s in stand_ins if s is not None and s.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, shared_view(grad)) if wanted else ())
        finish_reads([grad, *ctx.inputs])
        ctx.graph = ctx.inputs = None
        counters.executors[executors.VENDOR.name] += 1
        results = [adopt(next(grads), ctx.device) if s is not None and s.requires_grad else None for s in stand_ins]
        return (None, None, *results)


def _autograd_kernel(*args: Any, **kwargs: Any) -> Any:
    """turbine's autograd kernel of ``scaled_dot_product_attention``: the vendor's where it runs,
    else torch's composite (the math, each op recorded by autograd as usual)."""
    tensors, options = _bound(args, kwargs)
    device = _vendor_device(tensors)
    if device is None:
        return _SDPA.decompose(*args, **kwargs)
    return _VendorAttention.apply(device, options, *tensors)


def _inference(func: Any, args: tuple, kwargs: dict) -> Any:
    """The op as it reaches dispatch whole (no autograd): the vendor's forward, or the math."""
    tensors, options = _bound(args, kwargs)
    device = _vendor_device(tensors)
    if device is None:
        return func.decompose(*args, **kwargs)
    counters.executors[executors.VENDOR.name] += 1
    stand_ins = [None if t is None else shared_view(t) for t in tensors]
    out = torch.nn.functional.scaled_dot_product_attention(*stand_ins, **options)
    finish_reads([t for t in tensors if t is not None])
    return adopt(out, device)


_library: torch.library.Library | None = None


def register_autograd_kernel() -> None:
    """Register :func:`_autograd_kernel` for turbine's autograd key (once; the backend calls it
    after naming PrivateUse1). Calls on other devices are untouched."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("scaled_dot_product_attention", _autograd_kernel, "AutogradPrivateUse1")


declare(
    _SDPA,
    "on GPUs, torch's fused attention kernels over the device memory (the vendor executor); elsewhere torch's math",
    handler=_inference,
)
