"""log1p and expm1 for float64, by Kahan's quotients from log and exp; exp2 split at the integers.

IREE 3.13's float64 log1p and expm1 on the CPU computed log(1 + x) and exp(x) - 1 as written:
1.6e-5 relative error near 1e-11 and 0 for any argument below 1e-16 (its float32 ones are exact
to float32 and are kept). The functions here are also the helpers turbine's other corrections
call (asinh, acosh, atanh, sinh, elu): a correction's own torch calls are traced as they are.
Also here: logsumexp of a 0-d tensor, which IREE could not compile."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import registers
from turbine.eager.decompositions.bits import power_of_two

aten = torch.ops.aten


def log1p(x: torch.Tensor) -> torch.Tensor:
    """log(1 + x) as log(u) * x / (u - 1) of u = 1 + x, in float64: the quotient x / (u - 1)
    undoes the rounding of 1 + x (exact where u == 1: log1p(x) is x there)."""
    if x.dtype != torch.float64:
        return torch.log1p(x)
    u = 1 + x
    result = torch.where(u == 1, x, torch.log(u) * (x / (u - 1)))
    return torch.where(torch.isinf(x) & (x > 0), x, result)  # inf / inf in the quotient


def expm1(x: torch.Tensor) -> torch.Tensor:
    """exp(x) - 1 as (u - 1) * x / log(u) of u = exp(x), in float64 (exact where u == 1:
    expm1(x) is x there; -1 where u - 1 rounds to it)."""
    if x.dtype != torch.float64:
        return torch.expm1(x)
    u = torch.exp(x)
    quotient = (u - 1) * (x / torch.log(u))
    result = torch.where(u == 1, x, torch.where(u - 1 == -1, -torch.ones_like(x), quotient))
    return torch.where(torch.isinf(u), u, result)  # inf * inf / inf in the quotient


def exp2(x: torch.Tensor) -> torch.Tensor:
    """2**x as 2**n * exp((x - n) log 2) of n = round(x), in float64, the power of two exact (from
    its bits, in two factors so that neither leaves float64's range): IREE 3.13's exp2 was
    exp(x log 2), whose rounding of x log 2 grows with x (float32: 34 ulps at -71, float64:
    1e-14)."""
    dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    wide = x.to(torch.float64)
    whole = torch.round(torch.clamp(wide, -1100, 1100))  # beyond, 2**x is 0 or inf in float64 too
    fraction = torch.where(torch.isinf(wide), torch.zeros_like(wide), wide - whole)  # NaN stays NaN
    half = torch.floor(whole / 2)
    result = torch.exp(fraction * math.log(2)) * power_of_two(half) * power_of_two(whole - half)
    return result.to(dtype)


_torch_logsumexp = torch._decomp.decomposition_table[aten.logsumexp.default]


@registers(aten.logsumexp.default)
def logsumexp(input: torch.Tensor, dim: list[int], keepdim: bool = False) -> torch.Tensor:
    """torch's decomposition, a 0-d input taken as a 1-element one (IREE 3.13 legalized neither
    the op nor torch's decomposition of it for a 0-d input: 'torch.constant.int')."""
    if input.dim() == 0:
        return _torch_logsumexp(input.reshape(1), [0], False)
    return _torch_logsumexp(input, dim, keepdim)
