"""Elementwise ops on tensors laid out in another order than row-major, kept in that order.

torch's elementwise ops give their result the memory order of their inputs: ``relu`` of a
channels-last image is channels-last, ``x.t() + 1`` is transposed. turbine's kernels take dense
row-major inputs and write row-major results, so such an input was gathered into row-major order
first (a kernel) and the result came out row-major. Here the op runs on its inputs permuted into
their memory order (views that read the buffers as they lie, no gather) and its result is
permuted back: torch's strides, and a channels-last network keeps its layout from op to op
without a copy at each. Inputs of lower rank or size-1 dims (a bias of [C, 1, 1]) broadcast as
they did: they are viewed at full rank first.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager.signature import Leaves
from turbine.eager.tensor import DeviceTensor, inverse, memory_order, permuted


def order_kept(func: Any, leaves: Leaves, meta: Any) -> list[int] | None:
    """The memory order a pointwise call keeps (torch's, from the meta result's strides), where
    every input of the result's full shape lies in it; else None and the call runs row-major."""
    if torch.Tag.pointwise not in func.tags or not isinstance(meta, torch.Tensor):
        return None
    sizes = tuple(meta.shape)
    order = memory_order(sizes, tuple(meta.stride()))
    if order is None:
        return None
    for tensor in leaves.tensors:
        if tuple(tensor.shape) == sizes and memory_order(sizes, tuple(tensor.stride())) != order:
            return None  # mixed orders: permuting would leave one out of order
    return order


def may_keep_order(func: Any, leaves: Leaves) -> bool:
    """Whether a call may keep an order other than row-major, before its meta call says which:
    a pointwise op with an input dense in another order (a stored kernel, found by sizes alone,
    would not say)."""
    return torch.Tag.pointwise in func.tags and any(
        not tensor._dense and memory_order(tuple(tensor.shape), tuple(tensor.stride())) is not None for tensor in leaves.tensors
    )


def _full_rank(tensor: DeviceTensor, rank: int) -> DeviceTensor:
    """``tensor`` viewed with leading dims of size 1 up to ``rank`` (how broadcasting reads it)."""
    extra = rank - tensor.dim()
    if extra == 0:
        return tensor
    sizes = (1,) * extra + tuple(tensor.shape)
    strides = (1,) * extra + tuple(tensor.stride())
    return DeviceTensor(tensor._storage, sizes, strides, tensor.storage_offset())


class OrderedPlan:
    """A pointwise call run on its inputs permuted into ``order``, its result permuted back."""

    def __init__(self, func: Any, order: list[int], run: Callable[[Any, tuple, dict], Any]) -> None:
        self.func = func
        self.order = list(order)
        self.back = inverse(self.order)
        self.run = run  # dispatch's run: the permuted call goes through its own plan

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        rank = len(self.order)

        def into_order(value: Any) -> Any:
            if type(value) is DeviceTensor and value.dim() > 0:
                return permuted(_full_rank(value, rank), self.order)
            return value

        result = self.run(self.func, tuple(map(into_order, args)), {k: into_order(v) for k, v in kwargs.items()})
        return permuted(result, self.back)

    def record(self) -> tuple:
        return ("ordered", tuple(self.order))
