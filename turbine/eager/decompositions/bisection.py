"""``searchsorted``: where each value would go in a sorted sequence, by torch's binary search.

IREE 3.13 does not compile the op, so it fell back (NeRF-style samplers and interpolation tables
call it every step). Here the search runs as torch's kernel runs it: every value bisects its
sequence at once, one step per bit of the sequence's length, each step a gather of the middle
elements and a select. Following the same steps (rather than counting the elements below each
value) gives torch's answer even where a sequence holds NaNs, which its search treats as larger
than everything only on the steps that land on them.
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten

#: Bisection steps for a sequence whose length a shape-generic kernel does not know: enough for
#: any length a tensor dim can have.
_STEPS_FOR_ANY_LENGTH = 63


@registers(aten.searchsorted.Tensor)
def searchsorted(
    sorted_sequence: torch.Tensor,
    values: torch.Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: torch.Tensor | None = None,
) -> torch.Tensor:
    """torch's binary search, each step for every value at once (IREE 3.13 does not compile the op)."""
    if values.dim() == 0:  # IREE 3.13 did not compile the gather at a 0-d index
        found = searchsorted(sorted_sequence, values.reshape(1), out_int32=out_int32, right=right, side=side, sorter=sorter)
        return found.reshape(())
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    right = right or side == "right"
    length = sorted_sequence.shape[-1]
    steps = length.bit_length() if isinstance(length, int) else _STEPS_FOR_ANY_LENGTH
    start = torch.zeros(values.shape, dtype=torch.int64, device=values.device)
    end = torch.full(values.shape, length, dtype=torch.int64, device=values.device)
    for _ in range(steps):  # none for an empty sequence
        middle = start + torch.div(end - start, 2, rounding_mode="floor")
        middle_value = _at(sorted_sequence, torch.clamp_max(middle, length - 1))  # a finished search's middle: any element
        after = ~(middle_value > values) if right else ~(middle_value >= values)
        searching = start < end
        start = torch.where(searching & after, middle + 1, start)
        end = torch.where(searching & ~after, middle, end)
    return start.to(torch.int32) if out_int32 else start


def _at(sorted_sequence: torch.Tensor, index: torch.Tensor) -> Any:
    """The elements of a 1-d sequence at ``index``, or of each row of a batch of sequences."""
    if sorted_sequence.dim() == 1:
        return sorted_sequence[index]
    return sorted_sequence.gather(-1, index)


@registers(aten.searchsorted.Scalar)
def searchsorted_scalar(sorted_sequence: torch.Tensor, value: Any, **options: Any) -> torch.Tensor:
    """One value's search, compared in the dtype torch promotes the two to (IREE 3.13 does not compile the op)."""
    if not isinstance(value, torch.Tensor):
        value = torch.scalar_tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
    dtype = torch.promote_types(value.dtype, sorted_sequence.dtype)
    return searchsorted(sorted_sequence.to(dtype), value.to(dtype), **options)
