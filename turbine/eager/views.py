"""Reading and writing views that are not their whole storage.

Kernels take dense row-major buffers, and IREE's Python API cannot hand a kernel a buffer view
that starts inside a buffer (FACTS.md). So a strided view is gathered into a dense buffer by a
small kernel, and an in-place result on such a view is scattered back into a new storage buffer.
Both kernels compute the flat element index of the view on the device (a 1-D index: a 0-d index
crashes IREE 3.13's compiler), so no index data crosses from the host.

A view's geometry (sizes, strides, offset) is compiled into its kernel, until views of one rank
and dtype have come in two geometries (eager/dynamic.py's rule): from then on one kernel serves
them all, taking the sizes from a zero-element input of shape ``[*sizes, 0]`` (a dim IREE reads
from the buffer view, not from memory) and the strides and offset as one small int64 input.
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager import dynamic
from turbine.eager.dtypes import ELEMENT_TYPES, STORAGE_ONLY
from turbine.eager.lowering import lower
from turbine.eager.scalars import int_vector
from turbine.eager.tensor import DeviceTensor, empty, inverse, memory_order, wrap
from turbine.eager.transfer import download_dense, to_device
from turbine.device import BufferView, ready_fence, sizes_carrier, view_of
from turbine.errors import CompileError
from turbine.kernels_cache import kernel_cache
from turbine.kernels_cache.tracing import Dynamic

aten = torch.ops.aten


def meta_like(tensor: DeviceTensor) -> torch.Tensor:
    """A meta tensor with the same sizes, strides and offset over a storage of the same length."""
    base = torch.empty(tensor._storage.numel, dtype=tensor.dtype, device="meta")
    return base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def _flat_index(sizes: tuple, strides: Any, offset: Any) -> torch.Tensor:
    """Inside a trace: the storage index of every element of the view, as one 1-D int64 tensor
    (strides and offset numbers, or 0-d tensors of a generic kernel's input)."""
    index = offset + torch.zeros((1,) * max(len(sizes), 1), dtype=torch.int64)
    for dim, (size, stride) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[dim] = size
        index = index + (torch.arange(size, dtype=torch.int64) * stride).reshape(shape)
    return index.reshape(-1)


def _storage_on_host(storage) -> torch.Tensor:
    """A host copy of a whole storage, as a flat tensor."""
    return download_dense(DeviceTensor(storage, (storage.numel,)))


def to_host(tensor: DeviceTensor) -> torch.Tensor:
    """Copy a DeviceTensor's values to a new contiguous CPU tensor (waits for pending work); a
    view that is not its whole storage is gathered on the device first, so only its elements cross."""
    return download_dense(dense(tensor))


def to_host_laid_out(tensor: DeviceTensor) -> torch.Tensor:
    """Copy a DeviceTensor's values to a new CPU tensor with its strides where it is its whole
    storage in another order than row-major (channels-last, transposed), as torch's ``.cpu()``
    keeps them: its bytes as they lie, no gather. Else as :func:`to_host`."""
    if tensor._dense or tensor.storage_offset() != 0 or tensor._storage.numel != tensor.numel():
        return to_host(tensor)
    order = memory_order(tuple(tensor.shape), tuple(tensor.stride()))
    if order is None:
        return to_host(tensor)
    physical = DeviceTensor(tensor._storage, tuple(tensor.shape[d] for d in order))
    return download_dense(physical).permute(inverse(order))


def _flat_view(tensor: DeviceTensor) -> BufferView:
    storage = tensor._storage
    return view_of(storage.buffer, [storage.numel], ELEMENT_TYPES[storage.dtype])


def _geometry(tensor: DeviceTensor) -> tuple:
    return (tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), tensor._storage.numel, str(tensor.dtype))


def dense(tensor: DeviceTensor) -> DeviceTensor:
    """The tensor itself when it is its whole storage, else a dense copy of its elements."""
    if tensor._dense:
        return tensor
    sizes, strides, offset, numel, _ = geometry = _geometry(tensor)
    storage = tensor._storage
    if tensor.numel() == 0:
        return empty(sizes, tensor.dtype, storage.device)  # nothing to gather (and no kernel to compile)
    if storage.dtype in STORAGE_ONLY:  # no kernel takes complex: gather on the host
        return to_device(_storage_on_host(storage).as_strided(sizes, strides, offset).contiguous(), storage.device)

    generic = _generic_kernel("turbine.gather", tensor)
    if generic is not None:
        carrier = sizes_carrier(_flat_view(tensor), sizes, ELEMENT_TYPES[storage.dtype])
        inputs = [_flat_view(tensor), carrier, int_vector(storage.device, (*strides, offset))]
        ((buffer, view),) = generic.launch(inputs, ready_fence([storage.buffer]))
        return wrap(buffer, tensor.dtype, sizes, view)

    def gather(flat: torch.Tensor) -> torch.Tensor:
        return aten.index.Tensor(flat, [_flat_index(sizes, strides, offset)]).reshape(sizes)

    kernel = kernel_cache.kernel(
        ("turbine.gather",) + geometry,
        storage.device,
        lambda: lower(gather, [((numel,), storage.dtype)]),
        f"gather of a view {sizes} strides {strides} offset {offset}",
    )
    ((buffer, view),) = kernel.launch([_flat_view(tensor)], ready_fence([storage.buffer]))
    return wrap(buffer, tensor.dtype, sizes, view)


def write_resized(target: DeviceTensor, values: DeviceTensor) -> None:
    """Make ``target`` (an ``out=`` argument of another shape) hold ``values``, as torch's
    ``resize_output`` does: ``target`` is resized in place first (contiguous from its offset, over
    the same storage where the values fit), so a view passed as ``out=`` writes into its base."""
    torch.ops.aten.resize_.default(target, list(values.shape))
    write(target, values)


def _whole(tensor: DeviceTensor) -> bool:
    """Whether a tensor is all of its storage (in whatever order of dims)."""
    return tensor.storage_offset() == 0 and tensor._storage.numel == tensor.numel()


def write(target: DeviceTensor, values: DeviceTensor) -> None:
    """Make ``target`` hold ``values`` (same sizes and dtype), as an in-place op does.

    A target that is its whole storage takes the new buffer as it is; a partial view is scattered
    into a new buffer for the storage, so the base and every other view see the change. Values
    that are not dense (a host result uploaded in its own memory order) are gathered first.
    """
    storage = target._storage
    if _whole(target) and _whole(values) and target.stride() == values.stride():
        storage.buffer = values._storage.buffer  # laid out alike (row-major, or an elementwise op's order)
        return
    values = dense(values)
    if target._dense:
        storage.buffer = values._storage.buffer
        return
    if target.numel() == 0:
        return
    if storage.dtype in STORAGE_ONLY:  # no kernel takes complex: scatter on the host
        whole = _storage_on_host(storage)
        whole.as_strided(target.shape, target.stride(), target.storage_offset()).copy_(to_host(values))
        storage.buffer = to_device(whole, storage.device)._storage.buffer
        return
    sizes, strides, offset, numel, _ = geometry = _geometry(target)
    generic = _generic_kernel("turbine.scatter", target)
    if generic is not None:
        inputs = [_flat_view(target), values.buffer_view(), int_vector(storage.device, (*strides, offset))]
        ((storage.buffer, _),) = generic.launch(inputs, ready_fence([storage.buffer, values._storage.buffer]))
        return

    def scatter(flat: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        index = _flat_index(sizes, strides, offset)
        return aten.index_put.default(flat, [index], update.reshape(-1))

    kernel = kernel_cache.kernel(
        ("turbine.scatter",) + geometry,
        storage.device,
        lambda: lower(scatter, [((numel,), storage.dtype), (sizes, storage.dtype)]),
        f"write into a view {sizes} strides {strides} offset {offset}",
    )
    inputs = [_flat_view(target), values.buffer_view()]
    ((storage.buffer, _),) = kernel.launch(inputs, ready_fence([storage.buffer, values._storage.buffer]))


def _generic_kernel(kind: str, view: DeviceTensor) -> Any:
    """The one gather or scatter kernel of the view's rank and dtype, if the views of that rank and
    dtype have gone generic (eager/dynamic.py) and it compiles; else None (a kernel per geometry)."""
    storage, rank = view._storage, view.dim()
    key = (kind, rank, str(storage.dtype))
    if not dynamic.generic(key, _geometry(view), storage.device):
        return None
    sizes = tuple(Dynamic(f"s{d}", 2) for d in range(rank))
    flat = ((Dynamic("n", 16),), storage.dtype)
    geometry = ((rank + 1,), torch.int64)

    def gather(flat: torch.Tensor, carrier: torch.Tensor, geometry: torch.Tensor) -> torch.Tensor:
        sizes = carrier.shape[:rank]
        return aten.index.Tensor(flat, [_flat_index(sizes, geometry[:rank], geometry[rank])]).reshape(sizes)

    def scatter(flat: torch.Tensor, update: torch.Tensor, geometry: torch.Tensor) -> torch.Tensor:
        index = _flat_index(update.shape, geometry[:rank], geometry[rank])
        return aten.index_put.default(flat, [index], update.reshape(-1))

    if kind == "turbine.gather":
        traced, inputs = gather, [flat, ((*sizes, 0), storage.dtype), geometry]
    else:
        traced, inputs = scatter, [flat, (sizes, storage.dtype), geometry]
    try:
        return kernel_cache.kernel(
            (*key, "generic"), storage.device, lambda: lower(traced, inputs), f"{kind} of any rank-{rank} view",
            {"dynamic": True},
        )
    except CompileError:
        dynamic.refuse_generic(key, storage.device)
        return None
