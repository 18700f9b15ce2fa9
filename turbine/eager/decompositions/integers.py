"""Integer arithmetic that IREE 3.13 computed through floats: negation and floor division.

IREE 3.13 negated int32 and int64 tensors through float32 (-(2**30 + 1) gave -2**30, and
order_key's negation put close negative floats out of order), and floor-divided int64 through
float64 (wrong above 2**53 and for about one pair in four of large numbers of mixed signs); its
floor division of int8 and int16 did not compile. Subtraction and truncating division are exact,
so these are written with them.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

#: Narrow integers are negated and floor-divided in int32, which IREE 3.13 compiles exactly (uint8
#: never reaches a kernel: the traced call widens it to int16).
_NARROW = (torch.int8, torch.int16)


def _exact(dtype: torch.dtype) -> bool:
    """Whether IREE's own lowering is right for results of this dtype (floats and booleans)."""
    return dtype.is_floating_point or dtype.is_complex or dtype == torch.bool


def neg(x: torch.Tensor) -> torch.Tensor:
    """-x, as 0 - x for integers, wrapping as torch's does (-(-2**63) is -2**63); int8 and int16
    in int32 (IREE 3.13 cannot compile 0 - x for int8, and its float32 negation of int16 -32768
    came back clamped to 32767 on CUDA)."""
    if _exact(x.dtype):
        return aten.neg.default(x)
    if x.dtype in _NARROW:
        return (0 - x.to(torch.int32)).to(x.dtype)
    return 0 - x


def floor_quotient(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """x // other for integer tensors: the truncated quotient, one less where the division was
    inexact and the signs differ. Division by zero gives what IREE's truncated one gives (no
    error, as on torch's CUDA)."""
    dtype = torch.result_type(x, other)
    work = torch.int32 if dtype in _NARROW else dtype
    x, other = x.to(work), other.to(work)
    quotient = aten.div.Tensor_mode(x, other, rounding_mode="trunc")
    rounded_up = (quotient * other != x) & ((x < 0) != (other < 0))
    return (quotient - rounded_up.to(work)).to(dtype)


def floor_divide(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    if _exact(torch.result_type(x, other)):
        return aten.floor_divide.default(x, other)
    return floor_quotient(x, other)


def div_mode(x: torch.Tensor, other: torch.Tensor, *, rounding_mode: str | None = None) -> torch.Tensor:
    """``div`` with a rounding mode: floor division of integers exactly, the rest as IREE does it."""
    if rounding_mode != "floor" or _exact(torch.result_type(x, other)):
        return aten.div.Tensor_mode(x, other, rounding_mode=rounding_mode)
    return floor_quotient(x, other)
