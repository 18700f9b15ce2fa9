"""Activation gradients IREE 3.13 cannot lower, as torch's CPU kernels compute them."""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten


@registers(aten.hardshrink_backward.default)
def hardshrink_backward(grad_output: torch.Tensor, input: torch.Tensor, lambd: float) -> torch.Tensor:
    """Hard shrinkage's gradient: the output's gradient where the input is outside [-lambd,
    lambd], 0 inside and at NaN (torch's CPU kernel)."""
    outside = (input > lambd) | (input < -lambd)
    return torch.where(outside, grad_output, torch.zeros_like(grad_output))
