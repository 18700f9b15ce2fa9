"""Ops whose result's size is the number of true entries of a mask: ``nonzero`` (``argwhere``),
``masked_select``, and boolean masks as indices (``x[mask]``, ``x[mask] = values``).

torch has no shape rule for these (the size depends on the data), so turbine could not plan
them and they fell back, ``x[mask]`` and its gradient among them. torch's CUDA kernels read the
count on the host, and so does turbine: the mask's true entries are counted on the device, the
count read (one host wait), and the entries' flat positions written in order by one scatter:
each true entry's place is the running count of true entries before it, and false entries all
go to one extra place that is cut off. Everything else runs as IREE kernels of known shapes.
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager.registry import declare

aten = torch.ops.aten


def flat_positions(mask: torch.Tensor) -> torch.Tensor:
    """The flat positions of ``mask``'s nonzero entries, in order (int64, 1-d)."""
    flat = mask.reshape(-1) != 0
    count = int(aten.sum.default(flat, dtype=torch.int64).item())
    if count == 0:
        return torch.empty(0, dtype=torch.int64, device=mask.device)
    places = torch.where(flat, flat.cumsum(0) - 1, count)
    every = torch.arange(flat.numel(), dtype=torch.int64, device=mask.device)
    return torch.zeros(count + 1, dtype=torch.int64, device=mask.device).index_put((places,), every, accumulate=True)[:count]


def coordinates(positions: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """Flat positions in a tensor of ``shape`` as one index per dim."""
    dims, stride = [], 1
    for size in reversed(shape):
        dims.append(torch.remainder(torch.div(positions, stride, rounding_mode="floor"), size))
        stride *= size
    return dims[::-1]


def _nonzero(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """``nonzero``: each nonzero entry's coordinates, one row per entry in order."""
    input = args[0]
    positions = flat_positions(input)
    if input.dim() == 0:
        return torch.zeros((positions.shape[0], 0), dtype=torch.int64, device=input.device)
    return torch.stack(coordinates(positions, tuple(input.shape)), dim=1)


def _masked_select(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """``masked_select``: the entries where the (broadcast) mask is true, in order."""
    input, mask = args[0], args[1] if len(args) > 1 else kwargs["mask"]
    input, mask = torch.broadcast_tensors(input, mask)
    return input.reshape(-1).index_select(0, flat_positions(mask))


def mask_as_indices(tensor: torch.Tensor, indices: list) -> list:
    """Indexing's ``indices`` into ``tensor`` with each boolean mask replaced by the coordinates
    of its true entries, one index per dim it covers (what torch does before indexing); a mask
    of another shape than the dims it covers raises torch's IndexError."""
    expanded: list = []
    for index in indices:
        if index is None or index.dtype not in (torch.bool, torch.uint8):
            expanded.append(index)
            continue
        start = len(expanded)
        for k, size in enumerate(index.shape):
            if start + k >= tensor.dim() or tensor.shape[start + k] != size:
                raise IndexError(
                    f"The shape of the mask {list(index.shape)} at index {k} does not match the shape of the "
                    f"indexed tensor {list(tensor.shape)} at index {start + k}"
                )
        expanded.extend(coordinates(flat_positions(index), tuple(index.shape)))
    return expanded


declare(aten.nonzero.default, "the count of nonzero entries read on the host (as torch CUDA reads it), then IREE kernels", handler=_nonzero)
declare(aten.masked_select.default, "the mask's true entries found as nonzero finds them, then gathered", handler=_masked_select)
