"""Mixed precision's loss scale: GradScaler's update, which IREE 3.13 could not compile, so every
``scaler.update()`` of a mixed-precision training loop fell back."""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten


@registers(aten._amp_update_scale.default)
def amp_update_scale(
    scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor, growth_factor: float, backoff_factor: float, interval: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale backs off after a step that found an inf or NaN, and grows after ``interval``
    good steps in a row unless it would overflow, as torch's kernels update it: the products are
    taken in float64 and rounded once (their factors are C doubles), and the count of good steps
    restarts at each change or overflow."""
    found = found_inf != 0
    successful = growth_tracker + 1
    wide = scale.to(torch.float64)
    grown = (wide * growth_factor).to(scale.dtype)
    grows = ~found & (successful == interval)
    kept = torch.where(grows & torch.isfinite(grown), grown, scale)
    new_scale = torch.where(found, (wide * backoff_factor).to(scale.dtype), kept)
    return new_scale, torch.where(found | grows, torch.zeros_like(successful), successful)
