"""Constant padding with negative widths (a crop), which IREE 3.13's lowering sliced out of bounds,
and replication padding's gradient, which it does not lower."""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers
from turbine.eager.decompositions.resampling import spread

aten = torch.ops.aten


@registers(aten.constant_pad_nd.default)
def constant_pad_nd(input: torch.Tensor, pad: list[int], value: float = 0) -> torch.Tensor:
    """Padding as a crop (``narrow``) for the negative widths, then blocks of ``value`` joined on
    for the positive ones: IREE's lowering of a negative width (autograd's for every ``F.pad``)
    failed to compile ("slice ... runs out-of-bounds"). No ``constant_pad_nd`` is called: this
    function is the op's decomposition, so the trace would come back to it."""
    result = input
    for i in range(len(pad) // 2):
        dim = input.dim() - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        start, stop = max(-before, 0), result.shape[dim] - max(-after, 0)
        result = result.narrow(dim, start, max(stop - start, 0))
        parts = []
        for width in (before, after):
            shape = list(result.shape)
            shape[dim] = max(width, 0)
            parts.append(torch.full(shape, value, dtype=input.dtype, device=input.device))
        result = torch.cat([parts[0], result, parts[1]], dim)
    return result.clone() if result is input else result


def _replication_pad_backward(dims: int):
    def backward(grad_output: torch.Tensor, input: torch.Tensor, padding: list[int]) -> torch.Tensor:
        """Replication padding's gradient: each output place copied the input place nearest to it,
        so its gradient is added there, one dim at a time (the last dim's widths come first in
        ``padding``, as in ``F.pad``)."""
        result = grad_output
        for d in range(dims):
            axis = grad_output.dim() - dims + d
            before = padding[2 * (dims - 1 - d)]
            size = input.shape[axis]
            index = (torch.arange(result.shape[axis], device=grad_output.device) - before).clamp(0, size - 1)
            result = spread(result, axis, size, [(index, torch.ones(result.shape[axis], dtype=grad_output.dtype, device=grad_output.device))])
        return result

    return backward


for _dims in (1, 2, 3):
    registers(getattr(aten, f"replication_pad{_dims}d_backward").default)(_replication_pad_backward(_dims))
