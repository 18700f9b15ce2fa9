"""Results copied into torch's memory order, for ops whose kernels write other orders slowly.

Most kernels write a result in torch's order themselves (eager/kernel_orders.py). IREE 3.13
compiles convolutions and pooling that read or write a channels-last image as it lies many
times slower (the ``reads_row_major`` trait, eager/ops/kernels.py): those run row-major, on
gathered inputs, and each result torch lays out in another order is then copied so (a gather
kernel of its own), so that a channels-last network stays channels-last as in torch.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager import registry
from turbine.eager.kernel_orders import torch_orders
from turbine.eager.ops.layouts import laid_out
from turbine.eager.signature import Leaves

aten = torch.ops.aten


def relaid_strides(func: Any, leaves: Leaves, metas: list) -> tuple | None:
    """For a ``reads_row_major`` op, per result, torch's strides where they lay it out in another
    order than row-major (None for the others), from eager/kernel_orders.py's rule; else None."""
    if not registry.has_trait(func, "reads_row_major"):
        return None
    orders = torch_orders(leaves, metas)
    if orders is None:
        return None
    return tuple(None if order is None else tuple(meta.stride()) for meta, order in zip(metas, orders))


class RelaidPlan:
    """``plan``'s call, each result with ``strides`` (not None) copied into torch's layout."""

    def __init__(self, plan: Callable, strides: tuple, run: Callable[[Any, tuple, dict], Any]) -> None:
        self.plan = plan
        self.strides = tuple(strides)
        self.run = run  # dispatch's run: the copies go through their own plans

    @property
    def kernel_plan(self) -> Any:
        """The kernel plan that computes the results (None for a timed plan's vendor alone)."""
        return getattr(self.plan, "kernel_plan", self.plan)

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
