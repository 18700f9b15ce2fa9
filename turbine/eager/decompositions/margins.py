"""The margin losses, forward and backward, as torch's CPU kernels compute them: multi-label
(corrections of IREE's) and multi-class (IREE 3.13 lowers neither way of it; torch has no
decomposition of its backward, nor a shape rule, which turbine adds).

A sample's targets are its target row up to the first -1; torch's decomposition (and IREE's
lowering of the op) also counted the entries after it, and gave another loss for most inputs.
For each target class j of a sample and each class i that is not a target:
``max(0, 1 - (x[j] - x[i])) / C``, summed over the sample.
"""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers, shape_rule

aten = torch.ops.aten

_NONE, _MEAN, _SUM = 0, 1, 2


def _parts(scores: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(scores as [N, C], each target slot's class made safe, whether the slot counts
    [N, K], whether each class is a target [N, C], the margins [N, K, C] that count)."""
    classes = scores.shape[-1] if scores.dim() else 1
    x = scores.reshape(-1, classes)
    t = target.reshape(-1, classes)
    counts = (t >= 0).to(torch.int64).cumprod(1) > 0  # slots before the first -1
    safe = torch.where(counts, t, 0)
    picks = (safe.unsqueeze(-1) == torch.arange(classes, device=t.device)) & counts.unsqueeze(-1)  # [N, K, C]
    is_target = picks.any(1)
    target_scores = x.gather(1, safe)
    margins = (1 - (target_scores.unsqueeze(-1) - x.unsqueeze(1))).clamp(min=0)
    counted = counts.unsqueeze(-1) & ~is_target.unsqueeze(1)
    return x, picks, is_target, margins, counted


def multilabel_margin_loss_forward(scores: torch.Tensor, target: torch.Tensor, reduction: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss per sample (or reduced) and which classes are targets (torch's ``is_target``)."""
    x, _, is_target, margins, counted = _parts(scores, target)
    loss = torch.where(counted, margins, 0).sum((1, 2)) / x.shape[1]
    if reduction == _MEAN:
        loss = loss.mean()
    elif reduction == _SUM:
        loss = loss.sum()
    # (a single sample unreduced keeps shape [1]: torch's shape rule's, where its CPU kernel gives [])
    return loss.to(scores.dtype), is_target.to(scores.dtype).reshape(scores.shape)


def multilabel_margin_loss_backward(
    grad_output: torch.Tensor, scores: torch.Tensor, target: torch.Tensor, reduction: int, is_target: torch.Tensor
) -> torch.Tensor:
    """Each margin above 0 pulls its target class's score down by 1/C and its other class's up."""
    x, picks, _, margins, counted = _parts(scores, target)
    active = ((margins > 0) & counted).to(x.dtype)
    up = active.sum(1)  # [N, C]: as the class that is not a target
    down = (active.sum(2).unsqueeze(-1) * picks.to(x.dtype)).sum(1)  # [N, C]: as a target
    grad = (up - down) / x.shape[1]
    if reduction == _NONE and scores.dim() > 1:
        grad = grad * grad_output.reshape(-1, 1)
    else:
        grad = grad * grad_output / (x.shape[0] if reduction == _MEAN else 1)
    return grad.reshape(scores.shape).to(scores.dtype)


def _multi_margins(scores: torch.Tensor, target: torch.Tensor, margin, weight) -> tuple[torch.Tensor, ...]:
    """(scores as [N, C], each sample's margins [N, C] before the power, the classes that count
    (every class but the target), each sample's target weight [N, 1] or None)."""
    classes = scores.shape[-1] if scores.dim() else 1
    x = scores.reshape(-1, classes)
    t = target.reshape(-1, 1)
    margins = x - x.gather(1, t) + margin
    counted = (torch.arange(classes, device=x.device) != t) & (margins > 0)
    scale = None if weight is None else weight.index_select(0, t.reshape(-1)).unsqueeze(1)
    return x, margins, counted, scale


@registers(aten.multi_margin_loss.default)
def multi_margin_loss(scores, target, p=1, margin=1, weight=None, reduction=_MEAN):
    """Per sample, the margins by which the other classes come within ``margin`` of the target's
    score (squared for p=2, times the target's weight), summed and divided by the classes."""
    if scores.dim() <= 1 and reduction == _NONE:
        raise NotImplementedError("torch's shape rule gives one sample's unreduced loss shape [1], its kernel []: the kernel runs it")
    x, margins, counted, scale = _multi_margins(scores, target, margin, weight)
    terms = margins * margins if p == 2 else margins
    if scale is not None:
        terms = terms * scale
    loss = torch.where(counted, terms, 0).sum(1) / x.shape[1]
    if reduction == _MEAN:
        loss = loss.mean()
    elif reduction == _SUM:
        loss = loss.sum()
    return loss.to(scores.dtype)


@registers(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, scores, target, p, margin, weight=None, reduction=_MEAN):
    """Each counted margin raises its class's gradient and lowers the target's by as much."""
    x, margins, counted, scale = _multi_margins(scores, target, margin, weight)
    slope = 2 * margins if p == 2 else torch.ones_like(margins)
    if scale is not None:
        slope = slope * scale
    up = torch.where(counted, slope, 0) / x.shape[1]
    grad = up - up.sum(1, keepdim=True) * (torch.arange(x.shape[1], device=x.device) == target.reshape(-1, 1))
    if reduction == _NONE and scores.dim() > 1:
        grad = grad * grad_output.reshape(-1, 1)
    else:
        grad = grad * grad_output / (x.shape[0] if reduction == _MEAN else 1)
    return grad.reshape(scores.shape).to(scores.dtype)


@shape_rule("multi_margin_loss_backward")
@shape_rule("multilabel_margin_loss_backward")
def _margin_loss_backward_shape(grad_output, scores, *rest):
    """The gradient has the scores' shape (torch has no shape rule for it)."""
    return scores.new_empty(scores.shape)
