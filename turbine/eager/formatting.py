"""``repr`` of a DeviceTensor: torch's own formatting of the values, with the turbine device name."""

from __future__ import annotations

import torch


def tensor_repr(tensor: torch.Tensor) -> str:
    """Format like torch formats a CUDA tensor, but with ``device='turbine:cpu'`` (one host read)."""
    with torch.no_grad():
        host = tensor.cpu()  # through dispatch, as any copy to the CPU
    prefix = "tensor("
    suffixes = [f"device='{tensor._storage.device.name}'"]
    if host.numel() == 0:
        contents = "[]"
        if host.dim() != 1:
            suffixes.append(f"size={tuple(host.shape)}")
    else:
        contents = torch._tensor_str._tensor_str(host, len(prefix))
    if host.dtype not in (torch.get_default_dtype(), torch.int64, torch.bool):
        suffixes.append(f"dtype={host.dtype}")
    if tensor.grad_fn is not None:
        suffixes.append(f"grad_fn=<{type(tensor.grad_fn).__name__}>")
    elif tensor.requires_grad:
        suffixes.append("requires_grad=True")
    return prefix + contents + "".join(", " + s for s in suffixes) + ")"
