"""histc: counts in equal-width bins, as torch's CPU kernel bins them."""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten


@registers(aten.histc.default)
def histc(input: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """Counts of input in ``bins`` equal bins over [min, max] (the data's range when min == max;
    widened by 1 each way when that range is a point). Values outside, and NaNs, are not counted;
    a value equal to max goes in the last bin. The bin comes from the scaled position, then is
    moved by one where that rounding disagrees with the bin edges, as torch does."""
    x = input.reshape(-1)
    if min == max:
        low, high = x.amin() if x.numel() else x.new_zeros(()), x.amax() if x.numel() else x.new_zeros(())
        point = low == high
        low, high = torch.where(point, low - 1, low), torch.where(point, high + 1, high)
    else:
        low, high = x.new_full((), min), x.new_full((), max)
    inside = (x >= low) & (x <= high)
    position = torch.trunc((x - low) * bins / (high - low))
    position = torch.clamp(torch.where(inside, position, torch.zeros_like(position)), 0, bins - 1)
    step = (high - low) / bins
    left = low + position * step
    right = low + (position + 1) * step
    position = torch.where((x < left) & (position > 0), position - 1, position)
    position = torch.where((x >= right) & (position < bins - 1), position + 1, position)
    counts = torch.zeros(bins, dtype=input.dtype)
    return counts.index_put((position.to(torch.int64),), inside.to(input.dtype), accumulate=True)
