"""Copies laid out in memory as torch lays them out: ``memory_format=`` and kept strides.

turbine's kernels write their results row-major. torch's copies keep another order where one is
asked for (``x.contiguous(memory_format=torch.channels_last)``, ``x.to(memory_format=...)``) or,
by default, where the input is laid out densely in another order (a channels-last image, a
transposed matrix). Code then reads that order: ``permute(0, 2, 3, 1).view(n, -1, c)`` of a
channels-last tensor works in torch and failed on turbine. Here such a copy is made of the input
permuted into its memory order, row-major there (a kernel, or none where the input already is),
and permuted back: the result has torch's strides. Other ops' results take torch's layout the same way
(eager/relaid_plan.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager.registry import Continue, declare
from turbine.eager.tensor import dense_strides_like, inverse, memory_order, non_overlapping

aten = torch.ops.aten


def laid_out(copy: Callable[[Any], Any], source: Any, strides: tuple) -> Any:
    """``copy`` (a row-major copy) of ``source`` with ``strides`` (torch's), where those lay the
    elements out in another order: made of ``source`` permuted into that order, permuted back."""
    order = memory_order(tuple(source.shape), tuple(strides))
    if order is None:
        return None
    return copy(source.permute(order)).permute(inverse(order))


def copy_strides(source: Any, memory_format: Any) -> tuple | None:
    """The strides torch gives a copy of ``source`` in ``memory_format`` (``clone``'s,
    ``_to_copy``'s), where they may not be row-major; None where they are. Cheap for the common
    call, a row-major input kept so."""
    if memory_format is None or memory_format is torch.preserve_format:
        if source._dense:
            return None
        sizes, strides = tuple(source.shape), tuple(source.stride())
        if not non_overlapping(sizes, strides):
            return None  # an expanded input: torch's copy is row-major
        return dense_strides_like(sizes, strides)  # the input's order of dims, any gaps closed
    if memory_format is torch.contiguous_format:
        return None
    return torch.empty(tuple(source.shape), device="meta", memory_format=memory_format).stride()  # torch's rank errors too


def _clone(func: Any, args: tuple, kwargs: dict) -> Any:
    """``clone`` with torch's strides."""
    strides = copy_strides(args[0], kwargs.get("memory_format"))
    row_major = lambda permuted: aten.clone.default(permuted, memory_format=torch.contiguous_format)  # noqa: E731
    copied = None if strides is None else laid_out(row_major, args[0], strides)
    return Continue(args, kwargs) if copied is None else copied


declare(aten.clone.default, "a copy keeps torch's memory order (memory_format=, or the input's)", handler=_clone)
