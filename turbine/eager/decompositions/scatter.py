"""Scatters IREE 3.13 cannot compile as they are, written with the ones it can
(``scatter_reduce`` and ``index_put``): scatter (its compiler crashed on an index of two dims
or more: topk's backward), scatter with a reduce, scatter_add of any index shape, index_reduce,
put, masked_scatter and its gradient, diagonal_scatter and as_strided_scatter; and unfold's gradient, a scatter
of the windows' gradients."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten

_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


def _src_like_index(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The part of src a scatter reads: its leading corner of index's shape."""
    for dim, size in enumerate(index.shape):
        src = src.narrow(dim, 0, size)
    return src


def _coordinates(index: torch.Tensor, dim: int) -> tuple[torch.Tensor, ...]:
    """Where each entry of a scatter's index writes: the index along ``dim``, its own position
    along every other dim."""
    coordinates = []
    for axis, size in enumerate(index.shape):
        if axis == dim:
            coordinates.append(index)
        else:
            shape = [1] * index.dim()
            shape[axis] = size
            coordinates.append(torch.arange(size).reshape(shape).expand(index.shape))
    return tuple(coordinates)


@registers(aten.scatter.src)
def scatter(input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """scatter as index_put at each index entry's coordinates (of entries naming one place, one
    wins, as in torch)."""
    if index.dim() == 0:  # one entry, as an index of one element along each of input's dims
        one = [1] * max(input.dim(), 1)
        wide = input.reshape(input.shape or (1,))
        return scatter(wide, dim, index.reshape(one), src.reshape(-1)[:1].reshape(one)).reshape(input.shape)
    dim = dim % max(input.dim(), 1)
    return input.index_put(_coordinates(index, dim), _src_like_index(src, index))


@registers(aten.scatter.value)
def scatter_value(input: torch.Tensor, dim: int, index: torch.Tensor, value: float) -> torch.Tensor:
    return scatter(input, dim, index, torch.full(index.shape, value, dtype=input.dtype))


@registers(aten.scatter_add.default)
def scatter_add(input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    return aten.scatter_reduce.two(input, dim % max(input.dim(), 1), index, _src_like_index(src, index), "sum")


@registers(aten.scatter.reduce)
def scatter_with_reduce(input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *, reduce: str):
    return aten.scatter_reduce.two(input, dim % max(input.dim(), 1), index, _src_like_index(src, index), _SCATTER_REDUCE[reduce])


@registers(aten.scatter.value_reduce)
def scatter_value_with_reduce(input: torch.Tensor, dim: int, index: torch.Tensor, value: float, *, reduce: str):
    src = torch.full(index.shape, value, dtype=input.dtype)
    return aten.scatter_reduce.two(input, dim % max(input.dim(), 1), index, src, _SCATTER_REDUCE[reduce])


_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def scatter_reduce(
    input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *, include_self: bool = True
) -> torch.Tensor:
    """scatter_reduce with an integer mean rounded down, as torch rounds it (IREE's lowering
    rounded toward zero: -7.5 became -7 where torch gives -8): the sum over the count of values
    each place took, itself included where ``include_self``; a place that took none keeps its
    value. Every other reduce and dtype is the op as it is. (A correction in the op registry:
    eager/ops/corrections.py, which also counts ``dim`` from the front here: IREE 3.13 scattered
    along the wrong dim for a dim below -2.)"""
    dim = dim % max(input.dim(), 1)
    if reduce != "mean" or input.dtype not in _INTEGERS:
        return aten.scatter_reduce.two(input, dim, index, src, reduce, include_self=include_self)
    total = aten.scatter_reduce.two(input, dim, index, src, "sum", include_self=include_self)
    start = torch.full(input.shape, 1 if include_self else 0, dtype=input.dtype)
    count = aten.scatter_reduce.two(start, dim, index, torch.ones(index.shape, dtype=input.dtype), "sum")
    return torch.div(total, torch.clamp(count, min=1), rounding_mode="floor")


@registers(aten.index_reduce.default)
def index_reduce(input: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str, *, include_self: bool = True):
    """index_reduce is scatter_reduce with the index repeated along every other dim."""
    dim = dim % max(input.dim(), 1)
    shape = [1] * source.dim()
    shape[dim] = index.numel()
    expanded = index.reshape(shape).expand(source.shape)
    return scatter_reduce(input, dim, expanded, source, reduce, include_self=include_self)


@registers(aten.put.default)
def put(input: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """put indexes the tensor as if flat; negative indices count from the end."""
    flat = input.reshape(-1)
    index = index.reshape(-1)
    index = torch.where(index < 0, index + flat.numel(), index)
    return flat.index_put((index,), source.reshape(-1), accumulate).reshape(input.shape)


@registers(aten.unfold_backward.default)
def unfold_backward(grad: torch.Tensor, input_sizes: list[int], dim: int, size: int, step: int) -> torch.Tensor:
    """unfold's gradient: each window's gradient added where the window read, one ``index_add``
    along the unfolded dim (torch's decomposition indexes with a list holding None, which IREE's
    importer refuses)."""
    if not input_sizes:
        return grad.reshape(())
    dim = dim % len(input_sizes)
    windows = grad.shape[dim]
    index = (torch.arange(windows).unsqueeze(1) * step + torch.arange(size)).reshape(-1)
    source = grad.movedim(-1, dim + 1).flatten(dim, dim + 1)
    return torch.zeros(input_sizes, dtype=grad.dtype).index_add(dim, index, source)


@registers(aten.masked_scatter.default)
def masked_scatter(input: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """The k-th True of the (broadcast) mask takes source's k-th element, in row-major order."""
    shape = torch.broadcast_shapes(input.shape, mask.shape)
    mask = mask.expand(shape).reshape(-1)
    rank = torch.cumsum(mask.to(torch.int64), 0) - 1
    taken = source.reshape(-1).index_select(0, torch.clamp(rank, 0, max(source.numel() - 1, 0)))
    return torch.where(mask, taken, input.expand(shape).reshape(-1)).reshape(shape)


@registers(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad: torch.Tensor, mask: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """source's gradient: its k-th element gets grad where the (broadcast) mask's k-th True is,
    in row-major order, and 0 past the mask's count (multimodal models place image features
    with masked_scatter). Each True writes its rank; every other place the slot past the end."""
    count = math.prod(sizes)
    shape = torch.broadcast_shapes(grad.shape, mask.shape)
    mask = mask.expand(shape).reshape(-1)
    rank = torch.cumsum(mask.to(torch.int64), 0) - 1
    slot = torch.where(mask & (rank < count), rank, count)
    placed = torch.zeros(count + 1, dtype=grad.dtype).index_put((slot,), grad.expand(shape).reshape(-1))
    return placed[:count].reshape(sizes)


@registers(aten.diagonal_scatter.default)
def diagonal_scatter(input: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """input with its diagonal (as torch.diagonal picks it) replaced by src."""
    dims = input.dim()
    dim1, dim2 = dim1 % dims, dim2 % dims
    moved = input.movedim((dim1, dim2), (-2, -1))
    rows, columns = moved.shape[-2], moved.shape[-1]
    row = torch.arange(rows).unsqueeze(-1)
    column = torch.arange(columns)
    on_diagonal = column - row == offset
    position = torch.clamp(row if offset >= 0 else column + 0 * row, 0, max(src.shape[-1] - 1, 0))
    values = src.unsqueeze(-2).expand(moved.shape[:-2] + (rows, src.shape[-1]))
    placed = torch.gather(values, -1, position.expand(moved.shape[:-2] + (rows, columns)))
    return torch.where(on_diagonal, placed, moved).movedim((-2, -1), (dim1, dim2))


@registers(aten.as_strided_scatter.default)
def as_strided_scatter(input: torch.Tensor, src: torch.Tensor, size: list[int], stride: list[int], storage_offset: int | None = None):
    """The contiguous input with the elements of as_strided(size, stride, offset) set to src."""
    flat_index = torch.zeros(size, dtype=torch.int64) + (storage_offset or 0)
    for dim, (extent, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = extent
        flat_index = flat_index + torch.arange(extent).reshape(shape) * step
    if math.prod(size) == 0:
        return input.clone()
    flat = input.reshape(-1).index_put((flat_index.reshape(-1),), src.reshape(-1))
    return flat.reshape(input.shape)
