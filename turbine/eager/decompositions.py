"""turbine's own decompositions: ops IREE 3.13 cannot compile, written with ops it can.

torch's decomposition tables stop short for these: they either have no entry, or their entry
(a ``torch._refs`` function) traces into ``prims`` ops that IREE's importer does not take. Each
function here computes what torch's CPU kernel computes, to float precision, from elementwise
math, reductions and views that IREE lowers; the OpInfo suite (tests/opinfo) and
tests/test_decompositions.py compare them with torch.

The special functions use textbook methods (series, recurrences, asymptotic expansions,
Newton's method) rather than torch's fitted coefficients. They are evaluated in the input's
floating dtype, or float32 for integer inputs, as torch does.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

aten = torch.ops.aten

#: aten overload -> the function traced in its place.
TABLE: dict[torch._ops.OpOverload, Callable] = {}


def _registers(*ops: torch._ops.OpOverload) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for op in ops:
            TABLE[op] = fn
        return fn

    return register


def _floating(x: torch.Tensor) -> torch.Tensor:
    """``x`` as torch's unary float ops see it: integers and bools become the default float."""
    return x if x.dtype.is_floating_point else x.to(torch.get_default_dtype())


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)


# --- sign, magnitude and neighbours -------------------------------------------------------


@_registers(aten.signbit.default)
def signbit(x: torch.Tensor) -> torch.Tensor:
    """The sign bit itself (set for -0.0 and negative NaNs), read by viewing the float as an int."""
    if not x.dtype.is_floating_point:
        return x < 0
    if x.dim() == 0:  # IREE 3.13 cannot reinterpret a 0-d tensor
        return signbit(x.reshape(1)).reshape(())
    return x.view(_bits_dtype(x.dtype)) < 0


@_registers(aten.copysign.Tensor)
def copysign(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    magnitude = x.to(dtype).abs()
    return torch.where(signbit(other.to(dtype)), -magnitude, magnitude)


@_registers(aten.copysign.Scalar)
def copysign_scalar(x: torch.Tensor, other: float) -> torch.Tensor:
    magnitude = _floating(x).abs()
    return -magnitude if math.copysign(1.0, other) < 0 else magnitude


@_registers(aten.hypot.default)
def hypot(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """sqrt(x² + y²) scaled by the larger magnitude, so it neither overflows nor underflows early."""
    a, b = x.abs(), other.abs()
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(big == 0, torch.zeros_like(big), small / big)
    result = big * torch.sqrt(1 + ratio * ratio)
    result = torch.where(torch.isnan(a) | torch.isnan(b), a + b, result)  # IREE's maximum drops NaN
    infinite = torch.isinf(a) | torch.isinf(b)  # inf even when the other one is NaN, as C's hypot
    return torch.where(infinite, torch.full_like(result, math.inf), result)


@_registers(aten.fmax.default)
def fmax(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """max ignoring NaN: the other operand wins over a NaN."""
    return _ignoring_nan(torch.maximum, x, other)


@_registers(aten.fmin.default)
def fmin(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return _ignoring_nan(torch.minimum, x, other)


def _ignoring_nan(pick: Callable, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    x, other = x.to(dtype), other.to(dtype)
    if not dtype.is_floating_point:
        return pick(x, other)
    return torch.where(torch.isnan(x), other, torch.where(torch.isnan(other), x, pick(x, other)))


@_registers(aten.nextafter.default)
def nextafter(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """The next float after x towards other: one step of the integer bit pattern."""
    bits_dtype = _bits_dtype(x.dtype)
    bits = x.view(bits_dtype)
    away_from_zero = (x < other) == (x > 0)
    stepped = torch.where(away_from_zero, bits + 1, bits - 1).view(x.dtype)
    tiniest = torch.ones_like(bits).view(x.dtype)  # the smallest subnormal
    from_zero = torch.where(other > 0, tiniest, -tiniest)
    result = torch.where(x == 0, from_zero, stepped)
    result = torch.where(x == other, other, result)
    return torch.where(torch.isnan(x) | torch.isnan(other), x + other, result)


@_registers(aten.frexp.Tensor)
def frexp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = mantissa * 2**exponent with 0.5 <= |mantissa| < 1; zero, inf and NaN keep exponent 0."""
    # isnan, not isfinite: IREE folded isfinite's x == x to true inside this kernel.
    regular = ~torch.isnan(x) & ~torch.isinf(x) & (x != 0)
    magnitude = torch.where(regular, x.abs(), torch.ones_like(x))
    exponent = torch.floor(torch.log2(magnitude)) + 1
    mantissa = _times_power_of_two(x, -exponent)
    # log2 rounds near powers of two: one step either way puts the mantissa in [0.5, 1).
    low = mantissa.abs() < 0.5
    mantissa, exponent = torch.where(low, mantissa * 2, mantissa), torch.where(low, exponent - 1, exponent)
    high = mantissa.abs() >= 1
    mantissa, exponent = torch.where(high, mantissa / 2, mantissa), torch.where(high, exponent + 1, exponent)
    mantissa = torch.where(regular, mantissa, x)
    exponent = torch.where(regular, exponent, torch.zeros_like(exponent))
    return mantissa, exponent.to(torch.int32)


def _times_power_of_two(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x * 2**exponent, exact; in two steps so that neither factor overflows for subnormal x."""
    half = torch.floor(exponent / 2)
    return x * torch.exp2(half) * torch.exp2(exponent - half)


@_registers(aten.angle.default)
def angle(x: torch.Tensor) -> torch.Tensor:
    """The argument of a real number: pi for negatives, 0 otherwise, NaN kept."""
    x = _floating(x)
    result = torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, result)


@_registers(aten.log10.default)
def log10(x: torch.Tensor) -> torch.Tensor:
    return torch.log(_floating(x)) * (1 / math.log(10))


# --- pooling ---------------------------------------------------------------------------------


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


@_registers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool_nd(input: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return adaptive_max_pool(input, list(output_size))
