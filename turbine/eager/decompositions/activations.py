"""Activations and their gradients as torch's CPU kernels compute them: ones IREE 3.13 cannot
lower, and ones it lowers with the wrong branch at NaN or at a bound."""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers
from turbine.eager.decompositions.logarithms import log1p

aten = torch.ops.aten


@registers(aten.hardshrink_backward.default)
def hardshrink_backward(grad_output: torch.Tensor, input: torch.Tensor, lambd: float) -> torch.Tensor:
    """Hard shrinkage's gradient: the output's gradient where the input is outside [-lambd,
    lambd], 0 inside and at NaN (torch's CPU kernel)."""
    outside = (input > lambd) | (input < -lambd)
    return torch.where(outside, grad_output, torch.zeros_like(grad_output))


@registers(aten.softshrink_backward.default)
def softshrink_backward(grad_output: torch.Tensor, input: torch.Tensor, lambd: float) -> torch.Tensor:
    """Soft shrinkage's gradient: the output's gradient outside [-lambd, lambd], 0 inside and at
    NaN (torch's CPU kernel); IREE 3.13 has no lowering of it."""
    outside = (input > lambd) | (input < -lambd)
    return torch.where(outside, grad_output, torch.zeros_like(grad_output))


# Corrections (eager/ops/corrections.py): IREE 3.13 lowered these comparisons so that NaN took
# the other branch, or a bound counted as inside; torch's CPU kernels compare as below.


def threshold(input: torch.Tensor, threshold: float, value: float) -> torch.Tensor:
    """``x <= threshold ? value : x``: NaN stays NaN (IREE's gave the value)."""
    return torch.where(input <= threshold, torch.full_like(input, value), input)


def threshold_backward(grad_output: torch.Tensor, input: torch.Tensor, threshold: float) -> torch.Tensor:
    """``x <= threshold ? 0 : grad``: relu's gradient passes at NaN, as torch's (IREE's gave 0)."""
    return torch.where(input <= threshold, torch.zeros_like(grad_output), grad_output)


def hardtanh_backward(grad_output: torch.Tensor, input: torch.Tensor, min_val: float, max_val: float) -> torch.Tensor:
    """``x <= min or x >= max ? 0 : grad``: 0 at the bounds, so relu6's gradient at 0 and 6 is 0
    (IREE's passed the gradient there: MobileNet's relu6 at exactly 0)."""
    outside = (input <= min_val) | (input >= max_val)
    return torch.where(outside, torch.zeros_like(grad_output), grad_output)


def hardshrink(input: torch.Tensor, lambd: float = 0.5) -> torch.Tensor:
    """``-lambd <= x <= lambd ? 0 : x``: NaN stays NaN (IREE's gave 0)."""
    inside = (input >= -lambd) & (input <= lambd)
    return torch.where(inside, torch.zeros_like(input), input)


def softplus(input: torch.Tensor, beta: float = 1.0, threshold: float = 20.0) -> torch.Tensor:
    """``x * beta > threshold ? x : log1p(exp(x * beta)) / beta``, with an exact float64 log1p
    (IREE's float64 one gave 0 for exp(x) below 1e-16: softplus(-40) was 0, not 4e-18)."""
    scaled = input * beta
    return torch.where(scaled > threshold, input, log1p(torch.exp(scaled)) / beta)


def softplus_backward(grad_output: torch.Tensor, input: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    """``x * beta > threshold ? grad : grad * sigmoid(x * beta)``: NaN at NaN (IREE's gave the
    gradient)."""
    scaled = input * beta
    return torch.where(scaled > threshold, grad_output, grad_output * torch.sigmoid(scaled))
