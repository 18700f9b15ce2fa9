"""Adaptive max pooling for any input and output sizes."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten



def _adaptive_windows(size: int, out: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per output position, the first input index of its window and the last one, and the
    widest window: torch's windows run from floor(i*size/out) to ceil((i+1)*size/out)."""
    position = torch.arange(out)
    start = torch.div(position * size, out, rounding_mode="floor")
    stop = torch.div((position + 1) * size + out - 1, out, rounding_mode="floor")
    widest = max(-(-(i + 1) * size // out) - (i * size // out) for i in range(out))
    return start, stop - 1, widest


def adaptive_max_pool(input: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive max pooling over the last len(output_size) dims, for any sizes.

    Each window is read at the widest window's length, the narrower ones repeating their last
    element (which changes neither the max nor where it first occurs). Indices count into the
    flattened spatial dims, as torch's do.
    """
    n = len(output_size)
    spatial = list(input.shape[-n:])
    batch = list(input.shape[:-n])
    windows = [_adaptive_windows(size, out) for size, out in zip(spatial, output_size)]
    x = input
    for d, ((start, last, widest), out) in enumerate(zip(windows, output_size)):
        dim = len(batch) + 2 * d  # each earlier dim is now (out, widest)
        index = torch.minimum(start.unsqueeze(1) + torch.arange(widest).unsqueeze(0), last.unsqueeze(1))
        x = x.index_select(dim, index.reshape(-1))
        x = x.reshape(list(x.shape[:dim]) + [out, widest] + list(x.shape[dim + 1 :]))
    order = list(range(len(batch)))
    order += [len(batch) + 2 * d for d in range(n)] + [len(batch) + 2 * d + 1 for d in range(n)]
    x = x.permute(order).reshape(batch + list(output_size) + [-1])
    values, flat = torch.max(x, -1)
    indices = torch.zeros_like(flat)
    remaining = flat
    for d in reversed(range(n)):
        start, last, widest = windows[d]
        shape = [1] * len(batch) + [1] * n
        shape[len(batch) + d] = output_size[d]
        offset = torch.remainder(remaining, widest)
        remaining = torch.div(remaining, widest, rounding_mode="floor")
        position = torch.minimum(start.reshape(shape) + offset, last.reshape(shape))
        indices = indices + position * math.prod(spatial[d + 1 :])
    return values, indices


@registers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool_nd(input: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return adaptive_max_pool(input, list(output_size))
