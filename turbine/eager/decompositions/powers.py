"""Powers as torch's CPU kernels compute them, special values included.

IREE computes ``pow`` as exp(log(base) * exponent): a negative base gave NaN even for an integral
exponent (torch gives (-2) ** 2 == 4), in float32 the product's rounding reached the result (up
to 2e-6 off, 30 times torch's error), and the special values came out wrong: 0.0 ** -2 was -inf
and -0.0 ** -3 was +inf. torch follows C's ``pow`` (IEEE 754) and computes the exponents it
compiles in (-2, -1, -0.5, 0, 0.5, 1, 2, 3: eager/schema.py) with other code (x * x, 1 / x,
sqrt), exactly.

IREE 3.13 cannot compile an integer ``pow`` at all ("unimplemented: non-floating point dtype"),
nor one of an integer base and a float exponent: torch computes the first by squaring, wrapping
around as C does, and the second in the float result dtype.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def pow_tensor_tensor(base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``pow`` with a tensor (or runtime scalar) exponent: the magnitude from |base| (float32's
    computed in float64), its sign from an odd integral exponent, NaN for a finite negative
    base and a non-integral exponent, and C's special cases: x ** 0, 1 ** y and (-1) ** inf are 1.
    Integers by squaring (``integer_power``)."""
    dtype = torch.result_type(base, exponent)
    if dtype == torch.bool or dtype.is_complex:
        return aten.pow.Tensor_Tensor(base, exponent)
    if not dtype.is_floating_point:
        return integer_power(base.to(dtype), exponent.to(dtype))
    wide = torch.float64 if dtype == torch.float32 else dtype
    base, exponent = base.to(wide), exponent.to(wide)
    magnitude = aten.pow.Tensor_Tensor(base.abs(), exponent)
    integral = exponent == exponent.floor()
    odd = integral & (aten.remainder.Scalar(exponent, 2) == 1)
    negative = (base < 0) | ((base == 0) & (torch.reciprocal(base) < 0))  # -0.0 too: (-0.0) ** -3 is -inf
    power = torch.where(negative & odd, -magnitude, magnitude)
    power = torch.where((base < 0) & torch.isfinite(base) & ~integral, torch.full_like(power, float("nan")), power)
    one = (exponent == 0) | (base == 1) | ((base == -1) & torch.isinf(exponent))
    power = torch.where(one, torch.ones_like(power), power)
    return power.to(dtype)


def integer_power(base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """Integer ``pow`` as torch's kernels compute it: by squaring, once per bit of the exponent's
    type (the loop is unrolled into one kernel), the products wrapping around; a negative
    exponent gives 1 for a base of 1, +-1 for -1 and 0 for any other base. Types narrower than
    int32 multiply in int32, whose low bits are the same (IREE 3.13's compiler crashed on the
    int8 loop)."""
    dtype = base.dtype
    bits = torch.iinfo(dtype).bits - (1 if dtype.is_signed else 0)
    if dtype.itemsize < 4:
        base, exponent = base.to(torch.int32), exponent.to(torch.int32)
    base, exponent = torch.broadcast_tensors(base, exponent)
    remaining = torch.clamp_min(exponent, 0)
    power, square = torch.ones_like(base), base
    for _ in range(bits):
        power = torch.where(torch.bitwise_and(remaining, 1) == 1, power * square, power)
        square = square * square
        remaining = torch.div(remaining, 2, rounding_mode="trunc")
    odd = torch.bitwise_and(exponent, 1) == 1
    negative = torch.where(base == 1, 1, torch.where(base == -1, torch.where(odd, -1, 1), 0)).to(base.dtype)
    return torch.where(exponent < 0, negative, power).to(dtype)


def pow_tensor_scalar(base: torch.Tensor, exponent: float) -> torch.Tensor:
    """``pow`` with an exponent compiled into the kernel: for torch's special ones, the exact form
    torch's kernel uses; for others (inside another op's kernel: cdist's p = 1.5), as
    :func:`pow_tensor_tensor` does, the exponent's own cases decided here. IREE 3.13 folded
    comparisons of a float64 constant to true (``full((), 1.5, float64) == 0``), which made every
    such power 1."""
    base = base.to(torch.result_type(base, exponent))  # an integer base and a float exponent: in floats
    exact = {
        -2: lambda x: torch.reciprocal(x * x),
        -1: torch.reciprocal,
        -0.5: torch.rsqrt,
        0: torch.ones_like,
        0.5: torch.sqrt,
        1: torch.clone,
        2: lambda x: x * x,
        3: lambda x: x * x * x,
    }.get(exponent)
    if exact is not None:
        return exact(base)
    if not isinstance(exponent, (int, float)) or not base.dtype.is_floating_point:
        return aten.pow.Tensor_Tensor(base, _as_tensor(exponent, base.dtype))
    return _float_power_of_number(base, float(exponent))


def _float_power_of_number(base: torch.Tensor, exponent: float) -> torch.Tensor:
    """:func:`pow_tensor_tensor` for a float base and a number exponent (not 0: exact above)."""
    dtype = base.dtype
    wide = base.to(torch.float64)
    power = aten.pow.Tensor_Scalar(wide.abs(), exponent)
    if exponent < 0:  # IREE 3.13 gave 0.0 ** -7 as -inf
        power = torch.where(wide == 0, torch.full_like(power, math.inf), power)
    integral = math.isinf(exponent) or (not math.isnan(exponent) and exponent == math.floor(exponent))
    if math.isfinite(exponent) and integral and exponent % 2 == 1:
        negative = (wide < 0) | ((wide == 0) & (torch.reciprocal(wide) < 0))  # -0.0 too
        power = torch.where(negative, -power, power)
    if not integral:
        power = torch.where((wide < 0) & torch.isfinite(wide), torch.full_like(power, float("nan")), power)
    one = (wide == 1) | (wide == -1) if math.isinf(exponent) else wide == 1
    return torch.where(one, torch.ones_like(power), power).to(dtype)


def _as_tensor(number: float, dtype: torch.dtype) -> torch.Tensor:
    """A number as a 0-d tensor of ``dtype``. Inside another op's kernel the number may be
    symbolic (read at run time, as a float64 on the host, whose VM cannot convert it to float32):
    it is then made in float64 and converted by a tensor op."""
    if isinstance(number, (torch.SymFloat, torch.SymInt)):
        return torch.full((), number, dtype=torch.float64).to(dtype)
    return torch.full((), number, dtype=dtype)
