"""log1p and expm1 for float64, by Kahan's quotients from log and exp.

IREE 3.13's float64 log1p and expm1 on the CPU computed log(1 + x) and exp(x) - 1 as written:
1.6e-5 relative error near 1e-11 and 0 for any argument below 1e-16 (its float32 ones are exact
to float32 and are kept). The functions here are also the helpers turbine's other corrections
call (asinh, acosh, atanh, sinh, elu): a correction's own torch calls are traced as they are."""

from __future__ import annotations

import torch


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
