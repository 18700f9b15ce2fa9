"""Moving torch tensors between the host and turbine devices: the only host<->device data paths."""

from __future__ import annotations

import torch

from turbine.device import Device, download, upload
from turbine.eager.dtypes import check_dtype
from turbine.eager.tensor import DeviceTensor, memory_order, wrap


def to_device(tensor: torch.Tensor, device: Device, requires_grad: bool = False) -> DeviceTensor:
    """Copy a CPU tensor to a device as a new DeviceTensor over its own storage: row-major, or in
    the CPU tensor's order where that is dense in another (channels-last, transposed).

    The host-side steps run with torch.func's transforms off: inside ``jvp`` or ``jacrev`` they
    wrap the results of ops on plain tensors too, and a wrapped tensor has no bytes to upload."""
    check_dtype(tensor.dtype)
    with torch._C._DisableFuncTorch():
        # Dense in another order (channels-last, transposed): its bytes in that order, its strides
        # kept, as torch's .to() keeps them.
        order = None if tensor.is_contiguous() else memory_order(tuple(tensor.shape), tuple(tensor.stride()))
        data = tensor.detach().resolve_conj().resolve_neg()  # lazy conj/neg bits, made real
        data = (data if order is None else data.permute(order)).contiguous()
        flat = data.reshape(-1)
        if flat.numel() and flat.stride(0) != 1:  # one element broadcast (stride 0) counts as contiguous
            flat = flat.clone(memory_format=torch.contiguous_format)
        raw = flat.view(torch.uint8).numpy()  # as bytes: numpy has no bfloat16, empty or not
    result = wrap(upload(device, raw), data.dtype, tuple(data.shape))
    if order is not None:
        result = DeviceTensor(result._storage, tuple(tensor.shape), tuple(tensor.stride()))
    if requires_grad:
        result.requires_grad_(True)
    return result


def download_dense(tensor: DeviceTensor) -> torch.Tensor:
    """Copy a dense DeviceTensor's values to a new contiguous CPU tensor (waits for pending work).

    Other views are gathered on the device first: ``views.to_host`` does both.
    """
    nbytes = tensor.numel() * tensor.element_size()
    raw = torch.from_numpy(download(tensor._storage.buffer, nbytes))
    if nbytes and raw.stride(0) != 1:  # a buffer IREE filled with one repeated byte can map as stride 0
        raw = raw.contiguous()
    return raw.view(tensor.dtype).reshape(tensor.shape) if nbytes else torch.empty(tensor.shape, dtype=tensor.dtype)
