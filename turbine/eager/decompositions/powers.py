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
    """``pow`` with an exponent compiled into the kernel (one of torch's special ones): the
    exact form torch's kernel uses for it."""
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
    if exact is None:
        return pow_tensor_tensor(base, torch.full((), exponent, dtype=base.dtype))
    return exact(base)
