"""Indexing and concatenation: host index tensors, boolean masks, and empty inputs."""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager import masked
from turbine.eager.meta import meta_call
from turbine.eager.ops import bounds, selection
from turbine.eager.registry import Continue, declare
from turbine.eager.schema import schema_of
from turbine.eager.tensor import DeviceTensor
from turbine.eager.transfer import to_device

aten = torch.ops.aten


def _index(func: Any, args: tuple, kwargs: dict) -> Any:
    """Indexing accepts CPU index tensors (as on CUDA): they are uploaded to the indexed device.
    The out-of-place forms check each index against its dim (eager/ops/bounds.py); in-place
    ones run those. A boolean mask writing one value is a select (eager/masked.py); other masks
    become the coordinates of their true entries (eager/ops/selection.py), as torch makes them."""
    device = args[0]._storage.device if isinstance(args[0], DeviceTensor) else None
    indices = args[1]
    if device is not None and any(type(i) is torch.Tensor and i.dim() > 0 for i in indices):
        indices = [to_device(i, device) if type(i) is torch.Tensor and i.dim() > 0 else i for i in indices]
        args = (args[0], indices) + tuple(args[2:])
    if device is not None and func in _CHECKED:
        args = (args[0], bounds.check_indexing(args[0], indices)) + tuple(args[2:])
        indices = args[1]
    if any(masked.is_mask(i) for i in indices):
        if func is not aten.index.Tensor:
            result = masked.as_select(func, args, kwargs)  # no host read
            if result is not None:
                return result
        # IREE 3.13's index_put kernel with a mask crashed the process: coordinates instead
        args = (args[0], selection.mask_as_indices(args[0], indices)) + tuple(args[2:])
        if func is not aten.index.Tensor and any(i is not None and i.numel() == 0 for i in args[1]):
            return args[0] if func in _IN_PLACE else aten.clone.default(args[0])  # a mask of no true entry writes nothing
    return Continue(args, kwargs)


#: The index_put forms that write into their first argument.
_IN_PLACE = (aten.index_put_.default, aten._index_put_impl_.default)

#: The indexing ops that check their indices (their in-place forms run them).
_CHECKED = (aten.index.Tensor, aten.index_put.default, aten._index_put_impl.default)


def _cat(func: Any, args: tuple, kwargs: dict) -> Any:
    """``cat`` leaving out inputs with no elements: torch skips 1-D empty ones (a key-value cache
    before its first token) and the others add nothing, and IREE is not to be trusted with empty
    tensors (eager/planning.py). torch's shape rule still checks the whole call."""
    tensors = args[0]
    kept = [t for t in tensors if t.numel() != 0]
    if len(kept) == len(tensors) or not kept:
        return Continue(args, kwargs)
    meta = meta_call(func, schema_of(func), args, kwargs)
    result = func(kept, *args[1:], **kwargs) if len(kept) > 1 else aten.clone.default(kept[0])
    if result.dtype != meta.dtype:
        result = aten._to_copy.default(result, dtype=meta.dtype)
    return result


declare(aten.index.Tensor, "CPU index tensors are uploaded to the indexed device, as CUDA accepts them; boolean masks become their true entries' coordinates", handler=_index)
_INDEX_PUTS = [aten.index_put.default, aten.index_put_.default, aten._index_put_impl.default, aten._index_put_impl_.default]
declare(
    _INDEX_PUTS,
    "CPU index tensors are uploaded; a boolean mask writing one value is a select (eager/masked.py), other masks their true entries' coordinates (eager/ops/selection.py)",
    handler=_index,
)
declare(aten.cat.default, "inputs with no elements are left out: IREE is not to be trusted with empty tensors", handler=_cat)
