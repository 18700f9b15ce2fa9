"""Writing through a boolean mask (``x[mask] = v``, ``index_put`` with a mask) as a select.

IREE 3.13 compiles ``index_put`` with a boolean mask, but its kernel crashed the process, and
the number of elements written depends on the data. When one value is written to every selected
element (a 0-d or one-element ``values``, the usual ``grad[mask] = 0``), the write is
``where(mask, value, x)`` (``x + value`` where accumulating), one elementwise kernel with no
data-dependent shape. Other masked writes index with the coordinates of the mask's true entries
(eager/ops/selection.py).
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager.views import write

aten = torch.ops.aten


def is_mask(index: Any) -> bool:
    return index is not None and index.dtype in (torch.bool, torch.uint8)


def as_select(func: Any, args: tuple, kwargs: dict) -> Any:
    """``index_put`` / ``index_put_`` / ``_index_put_impl_`` with one mask index, as a select;
    None when the call is not of that form."""
    self, indices, values = args[0], args[1], args[2] if len(args) > 2 else kwargs["values"]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    masks = [i for i in indices if i is not None]
    if len(indices) != 1 or len(masks) != 1 or values.numel() != 1:
        return None
    mask = masks[0]
    if mask.dim() > self.dim() or tuple(mask.shape) != tuple(self.shape[: mask.dim()]):
        return None  # torch raises its own error for these: the plan's meta call gives it
    if mask.dtype == torch.uint8:
        mask = mask.to(torch.bool)  # torch reads a uint8 index as a mask too (deprecated)
    mask = mask.reshape(tuple(mask.shape) + (1,) * (self.dim() - mask.dim()))
    value = values.reshape(()).to(self.dtype)
    result = aten.where.self(mask, aten.add.Tensor(self, value) if accumulate else value, self)
    if func is aten.index_put.default:
        return result
    write(self, result)
    return self
