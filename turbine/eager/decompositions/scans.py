"""Scans: cummax, cummin and logcumsumexp in log2(n) steps; cumsum and cumprod in float64."""

from __future__ import annotations

import math
from typing import Callable

import torch

from turbine.eager.decompositions._common import floating, registers

aten = torch.ops.aten


def _scan(values: tuple[torch.Tensor, ...], dim: int, combine: Callable) -> tuple[torch.Tensor, ...]:
    """An inclusive scan along ``dim`` in log2(n) steps (Hillis and Steele): at step k each
    element combines with the running result 2**k places before it. ``combine(earlier, later)``
    takes and returns tuples of tensors and must be associative."""
    size = values[0].shape[dim]
    offset = 1
    while offset < size:
        earlier = tuple(v.narrow(dim, 0, size - offset) for v in values)
        later = tuple(v.narrow(dim, offset, size - offset) for v in values)
        combined = combine(earlier, later)
        values = tuple(torch.cat([v.narrow(dim, 0, offset), c], dim) for v, c in zip(values, combined))
        offset *= 2
    return values


def _cumulative_extreme(input: torch.Tensor, dim: int, later_wins: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """cummax/cummin: the running extreme and where it is; ties and NaNs point at the latest
    one, and a NaN, once seen, stays (torch's CPU rule)."""
    if input.dim() == 0:
        return input.clone(), torch.zeros((), dtype=torch.int64)
    shape = [1] * input.dim()
    shape[dim] = input.shape[dim]
    positions = torch.arange(input.shape[dim]).reshape(shape).expand(input.shape).contiguous()

    def combine(earlier, later):
        (value_a, index_a), (value_b, index_b) = earlier, later
        take_later = later_wins(value_b, value_a)
        if input.dtype.is_floating_point:
            take_later = torch.isnan(value_b) | (~torch.isnan(value_a) & take_later)
        return torch.where(take_later, value_b, value_a), torch.where(take_later, index_b, index_a)

    return _scan((input, positions), dim, combine)


@registers(aten.cummax.default)
def cummax(input: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _cumulative_extreme(input, dim, lambda later, earlier: later >= earlier)


@registers(aten.cummin.default)
def cummin(input: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _cumulative_extreme(input, dim, lambda later, earlier: later <= earlier)


def _log_add_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b)) without overflow; exact for equal infinities; NaN kept."""
    larger = torch.where(a > b, a, b)
    result = larger + torch.log1p(torch.exp(-(a - b).abs()))
    result = torch.where(a == b, a + math.log(2), result)
    return torch.where(torch.isnan(a) | torch.isnan(b), a + b, result)


@registers(aten.logcumsumexp.default)
def logcumsumexp(input: torch.Tensor, dim: int) -> torch.Tensor:
    """A scan of log-add-exp (IREE 3.13's own kernel gave inf for ordinary inputs), float32's in
    float64 as torch's CPU kernel runs it: its backward subtracts results from inputs, and a
    float32 scan's rounding made gradients of large inputs (10000) 0.6% off."""
    x = floating(input)
    if x.dim() == 0:
        return x.clone()
    wide = x.to(torch.float64) if x.dtype == torch.float32 else x
    return _scan((wide,), dim, lambda earlier, later: (_log_add_exp(earlier[0], later[0]),))[0].to(x.dtype)


#: Float types whose running sums and products accumulate in float64, as torch's CPU kernels do.
_WIDENED = (torch.float32, torch.float16, torch.bfloat16)


def cumsum(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A running sum accumulated in float64 for narrower floats: IREE 3.13's scan adds in order
    in the input's type, 3.5e-5 off at the end of 32000 probabilities (torch's CPU kernel, which
    accumulates in double, 5e-8): a top-p sampler compares such sums with its threshold."""
    return _widened(aten.cumsum.default, input, dim, dtype)


def cumprod(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A running product accumulated in float64 for narrower floats, as :func:`cumsum`; of
    integers, a scan of products wrapping around as torch's (IREE 3.13 could not compile an
    integer cumprod)."""
    result = dtype or (input.dtype if input.is_floating_point() or input.is_complex() else torch.int64)
    if result.is_floating_point or result.is_complex:
        return _widened(aten.cumprod.default, input, dim, dtype)
    integers = input.to(result)
    if integers.dim() == 0:
        return integers.clone()
    return _scan((integers,), dim, lambda earlier, later: (earlier[0] * later[0],))[0]


def _widened(scan: torch._ops.OpOverload, input: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
    """``scan`` (cumsum or cumprod) in float64 where its result is a narrower float, else as it is."""
    result = dtype or (input.dtype if input.is_floating_point() or input.is_complex() else torch.int64)
    if result not in _WIDENED:
        return scan(input, dim, dtype=dtype)
    return scan(input.to(torch.float64), dim).to(result)
