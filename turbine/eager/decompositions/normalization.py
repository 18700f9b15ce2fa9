"""Batch norm in evaluation mode, with the result shapes of torch's shape rule; group norm by
its groups' variances; the row renormalisation of ``nn.Embedding(max_norm=...)``; weight
normalisation's gradient."""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten


@registers(aten.embedding_renorm.default)
def embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """The embedding's rows that ``indices`` look up, scaled to norm ``max_norm`` where longer
    (by ``max_norm / (norm + 1e-7)``, as torch's kernel): IREE 3.13 cannot lower it, and every
    lookup of an ``nn.Embedding`` with ``max_norm`` fell back. A row looked up twice is written
    twice with the same value."""
    flat = indices.reshape(-1)
    rows = weight.index_select(0, flat)
    norms = torch.linalg.vector_norm(rows, norm_type, dim=1, keepdim=True)
    scaled = torch.where(norms > max_norm, rows * (max_norm / (norms + 1e-7)), rows)
    return torch.index_put(weight, (flat,), scaled)


@registers(aten.native_group_norm.default)
def native_group_norm(
    input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, N: int, C: int, HxW: int, group: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group norm by each group's var_mean: IREE 3.13's CUDA target failed to distribute
    torch-mlir's own where a group's size is a multiple of 32 (``GroupNorm(2, 8)`` of 4x4
    images), and every such group norm fell back; this one's variance, read through a gather
    (decompositions/widening.py), compiles. Half precision is normalised in float32, as torch does."""
    wide = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
    grouped = wide.reshape(N, group, -1)
    var, mean = torch.var_mean(grouped, -1, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = ((grouped - mean) * rstd).reshape(input.shape)
    per_channel = (1, C) + (1,) * (input.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    return out.to(input.dtype), mean.reshape(N, group).to(input.dtype), rstd.reshape(N, group).to(input.dtype)


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


@registers(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(
    grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor, saved_norms: torch.Tensor, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """weight_norm's gradient (wav2vec2's positional convolution, HiFi-GAN and WaveNet vocoders:
    IREE 3.13 cannot lower it). With w = g * v / |v|, the norm over every dim but ``dim``:
    grad_g = sum(grad_w * v) / |v| and grad_v = g / |v| * (grad_w - v * grad_g / |v|)."""
    dim = dim % saved_v.dim()
    others = [d for d in range(saved_v.dim()) if d != dim]
    sums = (grad_w * saved_v).sum(others, keepdim=True).reshape(saved_norms.shape)
    grad_g = sums / saved_norms
    grad_v = saved_g / saved_norms * (grad_w - saved_v * (grad_g / saved_norms))
    return grad_v, grad_g
