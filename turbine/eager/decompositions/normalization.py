"""Batch norm in evaluation mode, with the result shapes of torch's shape rule."""

from __future__ import annotations

import torch


def batch_norm_eval(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_native_batch_norm_legit_no_training``, with the result shapes of torch's shape rule.

    torch's decomposition gives the saved mean and inverse std as empty tensors when traced on
    the CPU (as torch's CPU kernel does) and as ``[C]`` tensors elsewhere (as torch's shape rule
    and its CUDA kernel do); turbine's results take the rule's shapes. Eval-mode backward reads
    the running statistics, not these. Half-precision inputs are normalised in float32, as torch does.
    """
    dtype = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    mean = running_mean.to(dtype)
    invstd = torch.rsqrt(running_var.to(dtype) + eps)
    shape = [1, -1] + [1] * (input.dim() - 2)
    output = (input.to(dtype) - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        output = output * weight.to(dtype).reshape(shape)
    if bias is not None:
        output = output + bias.to(dtype).reshape(shape)
    return output.to(input.dtype), mean, invstd
