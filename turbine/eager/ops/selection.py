"""Ops whose result's size is the number of true entries of a mask: ``nonzero`` (``argwhere``),
``masked_select``, boolean masks as indices (``x[mask]``, ``x[mask] = values``), ``unique``
and ``unique_consecutive`` (the mask of where a run of equal values starts); and ``bincount``,
whose size is the largest value plus one.

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

from turbine.eager.registry import Continue, declare
from turbine.eager.schema import bound_arguments

aten = torch.ops.aten


def flat_positions(mask: torch.Tensor) -> torch.Tensor:
    """The flat positions of ``mask``'s nonzero entries, in order (int64, 1-d)."""
    flat = mask.reshape(-1) != 0
    count = int(aten.sum.default(flat, dtype=torch.int64).item()) if flat.numel() else 0
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
    named = bound_arguments(func, args, kwargs)
    input, mask = torch.broadcast_tensors(named["self"], named["mask"])
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


def _runs(values: torch.Tensor, return_inverse: bool, return_counts: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each run of equal neighbours in 1-d ``values`` as one value (NaN equals nothing, as in
    torch's kernels); with each value's run, and each run's length, where asked for (else
    empty, as torch gives them)."""
    count = values.numel()
    starts = torch.ones(count, dtype=torch.bool, device=values.device)
    if count > 1:
        starts = torch.cat([starts[:1], values[1:] != values[:-1]])
    first = flat_positions(starts)
    nothing = torch.empty(0, dtype=torch.int64, device=values.device)
    run = starts.cumsum(0) - 1 if return_inverse else nothing
    lengths = torch.diff(first, append=torch.full((1,), count, dtype=torch.int64, device=values.device)) if return_counts else nothing
    return values.index_select(0, first), run, lengths


def _unique(func: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_unique2`` (``torch.unique`` without ``dim``): the runs of the stably sorted values,
    always in order (torch leaves the order of ``sorted=False`` open); each element's run found
    through the sort's permutation."""
    named = bound_arguments(func, args, kwargs)
    input, return_inverse = named["self"], named.get("return_inverse", False)
    values, order = torch.sort(input.reshape(-1), stable=True)
    unique, run, counts = _runs(values, return_inverse, named.get("return_counts", False))
    if return_inverse:
        run = torch.zeros_like(run).index_put((order,), run).reshape(input.shape)
    return unique, run, counts


def _unique_older(func: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``_unique``, ``_unique2`` without its counts (index_fill's gradient for a tensor value sums
    the gradient over the unique indices)."""
    unique, inverse, _ = _unique(aten._unique2.default, args, kwargs)
    return unique, inverse


def _unique_consecutive(func: Any, args: tuple, kwargs: dict) -> Any:
    """``unique_consecutive`` without ``dim``: the runs of equal neighbours."""
    named = bound_arguments(func, args, kwargs)
    if named.get("dim") is not None:
        return Continue(args, kwargs)
    input, return_inverse = named["self"], named.get("return_inverse", False)
    unique, run, counts = _runs(input.reshape(-1), return_inverse, named.get("return_counts", False))
    return unique, run.reshape(input.shape) if return_inverse else run, counts


def _bincount(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """``bincount``: the values' range read on the host (as torch CUDA reads it) sizes the
    result and checks that none is negative; then one index_add of ones, or of the weights
    (float32 ones as float32, any other as float64), with torch's CPU kernel's checks in its
    order (no values: int64 zeros of minlength, whatever the weights)."""
    named = bound_arguments(func, args, kwargs)
    input, weights, minlength = named["self"], named.get("weights"), named.get("minlength", 0)
    if input.dtype.is_floating_point or input.dtype.is_complex or input.dtype == torch.bool:
        raise NotImplementedError(f"bincount is not implemented for {input.dtype}: it counts integers")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if input.dim() == 1 and input.numel() == 0:
        return torch.zeros(minlength, dtype=torch.int64, device=input.device)
    smallest, largest = torch.stack([input.min(), input.max()]).tolist() if input.dim() == 1 else (-1, -1)
    if smallest < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != input.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    size = max(minlength, largest + 1)
    dtype = torch.int64 if weights is None else weights.dtype if weights.dtype == torch.float32 else torch.float64
    added = torch.ones(input.shape, dtype=dtype, device=input.device) if weights is None else weights.to(dtype)
    return torch.zeros(size, dtype=dtype, device=input.device).index_add(0, input.to(torch.int64), added)


declare(aten.nonzero.default, "the count of nonzero entries read on the host (as torch CUDA reads it), then IREE kernels", handler=_nonzero)
declare(aten.masked_select.default, "the mask's true entries found as nonzero finds them, then gathered", handler=_masked_select)
declare(aten._unique2.default, "a stable sort, then the starts of its runs of equal values found as nonzero finds them", handler=_unique)
declare(aten._unique.default, "as _unique2, without its counts", handler=_unique_older)
declare(aten.unique_consecutive.default, "the starts of the runs of equal neighbours found as nonzero finds them", handler=_unique_consecutive)
declare(aten.bincount.default, "its size is the largest value plus one, read on the host (as torch CUDA reads it), then an index_add", handler=_bincount)
