"""Pairwise distances: cdist and pdist, as torch's CPU kernels compute them.

For p = 2 torch may use the matrix-product form |x|² + |y|² - 2 x.y (faster, less exact);
cdist makes the same choice here (``compute_mode``), so the values agree to rounding.
"""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten

_USE_MM_IF_NECESSARY, _USE_MM, _DO_NOT_USE_MM = 0, 1, 2


def _norm_of_differences(diff: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm over the last dim: p = 0 counts nonzeros, p = inf takes the largest."""
    magnitude = diff.abs()
    if p == 0:
        return (magnitude != 0).to(diff.dtype).sum(-1)
    if p == math.inf:
        return magnitude.amax(-1) if diff.shape[-1] else magnitude.sum(-1)
    if p == 1:
        return magnitude.sum(-1)
    if p == 2:
        return torch.sqrt((magnitude * magnitude).sum(-1))
    return torch.pow(torch.pow(magnitude, p).sum(-1), 1 / p)


@registers(aten._cdist_forward.default)
def cdist(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None) -> torch.Tensor:
    rows, columns = x1.shape[-2], x2.shape[-2]
    mode = _USE_MM_IF_NECESSARY if compute_mode is None else compute_mode
    if p == 2 and (mode == _USE_MM or (mode == _USE_MM_IF_NECESSARY and (rows > 25 or columns > 25))):
        return aten._euclidean_dist.default(x1, x2)
    return _norm_of_differences(x1.unsqueeze(-2) - x2.unsqueeze(-3), p)


def _slope(diff: torch.Tensor, distances: torch.Tensor, p: float) -> torch.Tensor:
    """Each distance's derivative by its differences ``diff`` (``distances`` broadcast to them):
    ``sign(d) |d|^(p-1) / dist^(p-1)``; 0 where the distance or, for p < 1, the difference is 0,
    as torch's kernels have it (|0|^(p-1) is inf there: the gradient came out NaN)."""
    zero = torch.zeros_like(diff)
    if p == 0:
        return zero
    if p == 1:
        slope = torch.where(torch.isnan(diff), diff, torch.sign(diff))  # torch's sign of NaN is 0; its gradient NaN
    elif p == math.inf:
        slope = torch.where(diff.abs() == distances, torch.sign(diff), zero)
    elif p == 2:
        slope = diff / distances
    else:
        slope = torch.sign(diff) * torch.pow(diff.abs(), p - 1) / torch.pow(distances, p - 1)
        slope = torch.where(diff == 0, zero, slope)
    return torch.where(distances == 0, zero, slope)


@registers(aten._cdist_backward.default)
def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float, distances: torch.Tensor) -> torch.Tensor:
    """cdist's gradient for ``x1`` (autograd calls it again with the two swapped for ``x2``): each
    distance's derivative (:func:`_slope`), weighted by its gradient and summed over the other set."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    return (grad.unsqueeze(-1) * _slope(diff, distances.unsqueeze(-1), p)).sum(-2)


def _pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows i < j of pdist's pairs, in row-major order of the pairs."""
    first = torch.cat([torch.arange(n - 1 - i) * 0 + i for i in range(n - 1)])
    second = torch.cat([torch.arange(i + 1, n) for i in range(n - 1)])
    return first, second


@registers(aten._pdist_forward.default)
def pdist(input: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """Distances between rows i < j of an [n, m] input, in row-major order of the pairs."""
    n = input.shape[0]
    if n < 2:
        return input.new_zeros(0)
    first, second = _pairs(n)
    return _norm_of_differences(input.index_select(0, first) - input.index_select(0, second), p)


@registers(aten._pdist_backward.default)
def pdist_backward(grad: torch.Tensor, input: torch.Tensor, p: float, distances: torch.Tensor) -> torch.Tensor:
    """pdist's gradient: each pair's derivative (:func:`_slope`), weighted by its gradient, added
    to its first row and taken from its second."""
    first, second = _pairs(input.shape[0])  # (fewer than 2 rows never come here: their gradient is empty)
    diff = input.index_select(0, first) - input.index_select(0, second)
    change = grad.unsqueeze(-1) * _slope(diff, distances.unsqueeze(-1), p)
    return torch.zeros_like(input).index_add(0, first, change).index_add(0, second, -change)
