"""Results laid out in memory as torch lays them out, for ops whose kernels write row-major.

torch's convolutions, pooling, normalisation, padding, concatenation and interpolation give a
channels-last input a channels-last result; linear algebra on a transposed matrix gives a
column-major one. turbine's kernels write row-major results, so these came out row-major: right
values, other strides, and code that reads torch's layout broke (``conv(x_cl).permute(0, 2, 3,
1).view(n, -1, c)`` raised where torch's works; ``is_contiguous(memory_format=...)`` said False).
Where an input is laid out in another order than row-major and the meta call (torch's shape rule)
says a result is dense in another order, the call runs as it did and that result is copied into
torch's layout: a gather kernel of its own. Row-major inputs pay nothing. Elementwise ops keep
their inputs' order without a copy (eager/ordered_plan.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager.ops.layouts import laid_out
from turbine.eager.signature import Leaves
from turbine.eager.tensor import memory_order

aten = torch.ops.aten


def relaid_strides(leaves: Leaves, metas: list) -> tuple | None:
    """Per result, torch's strides where they lay it out in another order than row-major (None
    for the others); None where no input is laid out other than row-major, or no result is."""
    if all(tensor._dense for tensor in leaves.tensors):
        return None
    strides = tuple(
        None if meta is None or memory_order(tuple(meta.shape), tuple(meta.stride())) is None else tuple(meta.stride())
        for meta in metas
    )
    return strides if any(s is not None for s in strides) else None


def may_relay(leaves: Leaves) -> bool:
    """Whether a call may need a result in another order than row-major, before its meta call
    says: an input is dense in another order (a stored kernel, found by sizes alone, would not say)."""
    return any(
        not tensor._dense and memory_order(tuple(tensor.shape), tuple(tensor.stride())) is not None for tensor in leaves.tensors
    )


class RelaidPlan:
    """``plan``'s call, each result with ``strides`` (not None) copied into torch's layout."""

    def __init__(self, plan: Callable, strides: tuple, run: Callable[[Any, tuple, dict], Any]) -> None:
        self.plan = plan
        self.strides = tuple(strides)
        self.run = run  # dispatch's run: the copies go through their own plans

    @property
    def executor(self) -> Any:
        """Who runs the call itself (the copy is a gather kernel)."""
        return getattr(self.plan, "executor", None)

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        result = self.plan(leaves, args, kwargs)
        if isinstance(result, torch.Tensor):
            return self._relaid(result, self.strides[0])
        return type(result)(self._relaid(value, strides) for value, strides in zip(result, self.strides))

    def _relaid(self, value: Any, strides: tuple | None) -> Any:
        if strides is None or value is None or tuple(value.stride()) == strides:
            return value  # the vendor's kernels (torch's) already lay it out so
        return laid_out(self._row_major_copy, value, strides)

    def _row_major_copy(self, value: Any) -> Any:
        return self.run(aten.clone.default, (value,), {"memory_format": torch.contiguous_format})

    def record(self) -> tuple | None:
        inner = self.plan.record()
        return None if inner is None else ("relaid", self.strides, inner)
