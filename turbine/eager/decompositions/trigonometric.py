"""Elementwise functions whose IREE 3.13 kernels are imprecise: tan (a 3% relative error near
pi/2) and gelu's tanh form (5e-5 off: IREE lowers it with its own approximation)."""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import as_float64, result_dtype
from turbine.eager.decompositions.gamma import sin_pi


def tan(x: torch.Tensor) -> torch.Tensor:
    """sin/cos in float64 from the argument reduced by pi: exact to float32 for |x| < 1e8."""
    turns = as_float64(x) / math.pi
    return (sin_pi(turns) / sin_pi(turns + 0.5)).to(result_dtype(x))


def gelu(x: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    """gelu; its tanh form written out, with tanh from float64 exponentials."""
    if approximate != "tanh":
        return torch.ops.aten.gelu.default(x)
    wide = as_float64(x)
    inner = math.sqrt(2 / math.pi) * (wide + 0.044715 * wide * wide * wide)
    decay = torch.exp(-2 * inner.abs())
    tanh = torch.where(inner < 0, -1, 1) * (1 - decay) / (1 + decay)
    return (0.5 * wide * (1 + tanh)).to(x.dtype)
