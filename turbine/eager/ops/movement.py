"""Ops that move data between devices or to the host: declared with handlers, not kernels."""

from __future__ import annotations

from typing import Any

import torch

from turbine.counters import counters
from turbine.device import Device, by_index
from turbine.eager import executors
from turbine.eager.executors.torch_kernel import adopt, finish_reads, shared_view, torch_device
from turbine.eager.ops.layouts import copy_strides, laid_out
from turbine.eager.registry import Continue, declare
from turbine.eager.tensor import DeviceTensor
from turbine.eager.transfer import to_device
from turbine.eager.views import to_host, to_host_laid_out, write

aten = torch.ops.aten


def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    source = args[0]
    target = kwargs.get("device")
    dtype = kwargs.get("dtype") or source.dtype
    if target is None or (target.type == "turbine" and target.index == source._storage.device.index):
        kwargs = {k: v for k, v in kwargs.items() if k != "device"}
        strides = copy_strides(source, kwargs.get("memory_format"))
        if strides is not None:
            row_major = {**kwargs, "memory_format": torch.contiguous_format}
            copied = laid_out(lambda permuted: aten._to_copy.default(_staged(permuted, dtype), **row_major), source, strides)
            if copied is not None:
                return copied
        return Continue((_staged(source, dtype),) + tuple(args[1:]), kwargs)
    if target.type == "turbine" and dtype == source.dtype:
        return _moved(source, by_index(target.index))
    host_copy = to_host_laid_out(source).to(dtype)
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        host_copy = host_copy.contiguous(memory_format=kwargs["memory_format"])
    if target.type == "cpu":
        return host_copy
    if target.type == "turbine":
        return to_device(host_copy, by_index(target.index))
    raise RuntimeError(f"turbine cannot copy a tensor to {target}; copy it to the CPU first (.cpu())")


def _staged(source: DeviceTensor, dtype: torch.dtype) -> DeviceTensor:
    """``source``, first converted to the dtype through which IREE 3.13 reaches ``dtype`` as torch
    does: floats to uint8 through int32 (IREE converted them as to int8: 178.7 gave 127), float64
    to float16 and bfloat16 through float32 (IREE flushed float16's subnormals, 3e-5, to 0;
    c10::Half and c10::BFloat16 are made from a float)."""
    if dtype == torch.uint8 and source.dtype.is_floating_point:
        return aten._to_copy.default(source, dtype=torch.int32)
    if dtype in (torch.float16, torch.bfloat16) and source.dtype == torch.float64:
        return aten._to_copy.default(source, dtype=torch.float32)
    return source


def _moved(source: DeviceTensor, target: Device) -> DeviceTensor:
    """``source``'s values on another turbine device: device to device where torch can copy
    them (:func:`_device_to_device`), else through the host."""
    moved = _device_to_device(source, target)
    return moved if moved is not None else to_device(to_host(source), target)


def _device_to_device(source: DeviceTensor, target: Device) -> DeviceTensor | None:
    """A copy to another turbine device made by torch, device to device (a CUDA peer copy between
    two GPUs), where the vendor executor runs on both (eager/executors/vendor.py); else None, and
    the copy goes through the host. IREE 3.13 has no copy between two of its devices."""
    here = source._storage.device
    if not (executors.VENDOR.runs_on(here) and executors.VENDOR.runs_on(target)):
        return None
    values = shared_view(source).to(torch_device(target), copy=True)  # after the source's last write
    finish_reads([source])
    counters.device_copies += 1
    return adopt(values, target)


def _copy_(func: Any, args: tuple, kwargs: dict) -> Any:
    destination, source = args[0], args[1]
    if not isinstance(destination, DeviceTensor):
        return destination.copy_(to_host(source))
    device = destination._storage.device
    if not isinstance(source, DeviceTensor):
        # Host data: cast and broadcast on the host, upload once, write in place.
        values = torch.as_tensor(source).to(destination.dtype).expand(destination.shape)
        write(destination, to_device(values, device))
        return destination
    if source._storage.device is not device:
        source = _moved(source, device)
    return Continue((destination, _staged(source, destination.dtype)) + tuple(args[2:]), kwargs)


def _item(func: Any, args: tuple, kwargs: dict) -> Any:
    return to_host(args[0]).item()


def _equal(func: Any, args: tuple, kwargs: dict) -> bool:
    """``torch.equal``: same sizes and values (NaN unequal), decided on the device; the host
    reads one bool, as torch's own CUDA kernel does."""
    a, b = args
    if a.shape != b.shape:
        return False
    return bool(to_host(aten.all.default(aten.eq.Tensor(a, b))).item())


def _allclose(func: Any, args: tuple, kwargs: dict) -> bool:
    """``torch.allclose`` as isclose(...).all() on the device; the host reads one bool."""
    return bool(to_host(aten.all.default(aten.isclose.default(*args, **kwargs))).item())


declare(aten._to_copy.default, "a copy to another device crosses through the host; on its own device it is a kernel", handler=_to_copy)
declare(aten.copy_.default, "host values are uploaded once, values of another turbine device cross through the host", handler=_copy_)
declare(aten._local_scalar_dense.default, "`.item()` reads one value on the host", handler=_item)
declare(aten.equal.default, "decided on the device; the host reads one bool", handler=_equal)
declare(aten.allclose.default, "isclose(...).all() on the device; the host reads one bool", handler=_allclose)
