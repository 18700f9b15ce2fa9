"""Sign, magnitude and neighbouring floats: signbit, copysign, fmod, hypot, fmax/fmin, nextafter,
frexp, angle, log10."""

from __future__ import annotations

import math
from typing import Callable

import torch

from turbine.eager.decompositions._common import floating, registers
from turbine.eager.decompositions.integers import safe_divisor

aten = torch.ops.aten


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The signed integer type as wide as a float type."""
    return {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)



@registers(aten.signbit.default)
def signbit(x: torch.Tensor) -> torch.Tensor:
    """The sign bit itself (set for -0.0 and negative NaNs), read by viewing the float as an int."""
    if not x.dtype.is_floating_point:
        return x < 0
    if x.dim() == 0:  # IREE 3.13 cannot reinterpret a 0-d tensor
        return signbit(x.reshape(1)).reshape(())
    return x.view(_bits_dtype(x.dtype)) < 0


@registers(aten.copysign.Tensor)
def copysign(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    magnitude = x.to(dtype).abs()
    return torch.where(signbit(other.to(dtype)), -magnitude, magnitude)


@registers(aten.copysign.Scalar)
def copysign_scalar(x: torch.Tensor, other: float) -> torch.Tensor:
    magnitude = floating(x).abs()
    return -magnitude if math.copysign(1.0, other) < 0 else magnitude


@registers(aten.fmod.Scalar)
def fmod_scalar(x: torch.Tensor, other: float) -> torch.Tensor:
    """fmod by a number, as fmod by a 0-d tensor: IREE 3.13 lowers only the tensor form, and
    torch's decompositions emit this one (grid_sample's reflection padding)."""
    dtype = torch.result_type(x, other)
    return fmod(x.to(dtype), aten.scalar_tensor.default(other, dtype=dtype))


#: Steps of :func:`fmod`'s reduction: each takes about 26 bits off the exponent gap between x and
#: y, which for float32 is at most 276 (largest over smallest subnormal).
_FMOD_STEPS = 12


def fmod(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """x - trunc(x / y) * y exactly, as C's fmod (the result is always representable): IREE
    3.13's float32 one computed it as written, wrong from quotients near 1e7 on (fmod(3e7, 0.7)
    was -0.289, not 0.411). Floats narrower than float64 are reduced in float64 by y scaled by
    a power of two so that each quotient has at most 28 bits: every product and difference is
    then exact. float64 and integers go to IREE's own op."""
    dtype = torch.result_type(x, other)
    if dtype == torch.float64:
        return aten.fmod.Tensor(x, other)
    if not dtype.is_floating_point:  # x fmod -1 is x fmod 1; by 0, reported at the next read (ops/bounds.py)
        return aten.fmod.Tensor(x, safe_divisor(other))
    shape = torch.broadcast_shapes(x.shape, other.shape)
    wide_x = x.to(torch.float64).expand(shape).reshape(-1)  # 1-d: IREE cannot reinterpret 0-d tensors
    wide_y = other.to(torch.float64).expand(shape).reshape(-1)
    a, magnitude_y = wide_x.abs(), wide_y.abs()
    regular = torch.isfinite(a) & torch.isfinite(magnitude_y) & (magnitude_y != 0)
    remainder = torch.where(regular, a, torch.zeros_like(a))
    b = torch.where(regular, magnitude_y, torch.ones_like(a))
    for _ in range(_FMOD_STEPS):
        gap = torch.floor(torch.log(remainder / b) * (1 / math.log(2)))  # -inf once the remainder is 0
        shift = torch.clamp(gap - 26, min=0)
        scaled = b * power_of_two(shift)
        quotient = torch.trunc(remainder / scaled)
        remainder = remainder - quotient * scaled
        remainder = torch.where(remainder < 0, remainder + scaled, remainder)  # the quotient rounded up
    result = torch.where(signbit(wide_x), -remainder, remainder)
    result = torch.where(regular, result, torch.where(torch.isinf(magnitude_y) & torch.isfinite(a), wide_x, torch.full_like(a, math.nan)))
    return result.reshape(shape).to(dtype)


def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent in float64, exact, for whole exponents in [-1022, 1023] (built from its bits:
    IREE's float64 exp2 is not exact)."""
    return ((exponent.to(torch.int64) + 1023) * (1 << 52)).view(torch.float64)


def ldexp(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """x * 2**other, exact until it rounds to x's float dtype (float32 for integers), as torch's
    kernels compute it: IREE's own ldexp was an ulp off (9.2e17 * 2**32 in float32), and its
    float64 powers of 2 are exp(log(2) * e). The product is taken in float64 by exact powers of
    2, the one that may round (to a subnormal) last; a float exponent goes to IREE's op."""
    if other.dtype.is_floating_point:
        return aten.ldexp.Tensor(x, other)
    exponent = torch.clamp(other.to(torch.int64), -2200, 2200)  # past these, any finite x gives 0 or inf
    last = torch.clamp(exponent, -1022, 1023)
    rest = exponent - last  # what the last power cannot hold: it keeps the partial product normal
    half = torch.div(rest, 2, rounding_mode="trunc")
    product = floating(x).to(torch.float64) * power_of_two(half) * power_of_two(rest - half) * power_of_two(last)
    return product.to(floating(x).dtype)


@registers(aten.hypot.default)
def hypot(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """sqrt(x² + y²) scaled by the larger magnitude, so it neither overflows nor underflows early."""
    a, b = x.abs(), other.abs()
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(big == 0, torch.zeros_like(big), small / big)
    result = big * torch.sqrt(1 + ratio * ratio)
    result = torch.where(torch.isnan(a) | torch.isnan(b), a + b, result)  # IREE's maximum drops NaN
    infinite = torch.isinf(a) | torch.isinf(b)  # inf even when the other one is NaN, as C's hypot
    return torch.where(infinite, torch.full_like(result, math.inf), result)


@registers(aten.fmax.default)
def fmax(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """max ignoring NaN: the other operand wins over a NaN."""
    return _ignoring_nan(torch.maximum, x, other)


@registers(aten.fmin.default)
def fmin(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return _ignoring_nan(torch.minimum, x, other)


def _ignoring_nan(pick: Callable, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, other)
    x, other = x.to(dtype), other.to(dtype)
    if not dtype.is_floating_point:
        return pick(x, other)
    return torch.where(torch.isnan(x), other, torch.where(torch.isnan(other), x, pick(x, other)))


@registers(aten.nextafter.default)
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


@registers(aten.frexp.Tensor)
def frexp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = mantissa * 2**exponent with 0.5 <= |mantissa| < 1; zero, inf and NaN keep exponent 0."""
    # isnan, not isfinite: IREE folded isfinite's x == x to true inside this kernel.
    regular = ~torch.isnan(x) & ~torch.isinf(x) & (x != 0)
    magnitude = torch.where(regular, x.abs(), torch.ones_like(x))
    exponent = torch.floor(torch.log2(magnitude)) + 1
    mantissa = _timespower_of_two(x, -exponent)
    # log2 rounds near powers of two: one step either way puts the mantissa in [0.5, 1).
    low = mantissa.abs() < 0.5
    mantissa, exponent = torch.where(low, mantissa * 2, mantissa), torch.where(low, exponent - 1, exponent)
    high = mantissa.abs() >= 1
    mantissa, exponent = torch.where(high, mantissa / 2, mantissa), torch.where(high, exponent + 1, exponent)
    mantissa = torch.where(regular, mantissa, x)
    exponent = torch.where(regular, exponent, torch.zeros_like(exponent))
    return mantissa, exponent.to(torch.int32)


def _timespower_of_two(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x * 2**exponent, exact; in two steps so that neither factor overflows for subnormal x."""
    half = torch.floor(exponent / 2)
    return (x * power_of_two(half) * power_of_two(exponent - half)).to(x.dtype)


@registers(aten.angle.default)
def angle(x: torch.Tensor) -> torch.Tensor:
    """The argument of a real number: pi for negatives, 0 otherwise, NaN kept."""
    x = floating(x)
    result = torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, result)


@registers(aten.log10.default)
def log10(x: torch.Tensor) -> torch.Tensor:
    return torch.log(floating(x)) * (1 / math.log(10))


@registers(aten.isclose.default)
def isclose(x: torch.Tensor, other: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False):
    """|x - other| <= atol + rtol * |other|, exact matches (infinities) included; torch's own
    decomposition updates a bool tensor in place, which IREE 3.13 rejects."""
    if not (x.dtype.is_floating_point or other.dtype.is_floating_point):
        x, other = x.to(torch.float64), other.to(torch.float64)
    close = (x == other) | ((x - other).abs() <= atol + rtol * other.abs())
    if equal_nan:
        close = close | (torch.isnan(x) & torch.isnan(other))
    return close
