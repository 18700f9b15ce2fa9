"""Binary cross-entropy with logits as torch's CPU kernel computes it.

IREE 3.13's lowering of ``binary_cross_entropy_with_logits`` failed to compile with a weight that
broadcasts (a weight per class, [C] for an [N, C] input) and a reduction ('vector.contract' op
invalid accumulator/result vector shape), and with both a weight and a pos_weight ('tensor.cast'
op ... cast incompatible): ``BCEWithLogitsLoss(weight=...)``, a multi-label classifier's loss,
fell back.
"""

from __future__ import annotations

from typing import Optional

import torch

_NONE, _MEAN, _SUM = 0, 1, 2


def binary_cross_entropy_with_logits(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    pos_weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
) -> torch.Tensor:
    """``(1 - t) x - (1 + (p - 1) t) log sigmoid(x)``, times the weight, then reduced (a
    correction, declared in eager/ops/corrections.py)."""
    log_sigmoid = torch.clamp_max(input, 0) - torch.log1p(torch.exp(-input.abs()))
    if pos_weight is not None:
        loss = (1 - target) * input - ((pos_weight - 1) * target + 1) * log_sigmoid
    else:
        loss = (1 - target) * input - log_sigmoid
    if weight is not None:
        loss = loss * weight
    if reduction == _NONE:
        return loss
    total = loss.sum(-1).sum() if loss.dim() else loss  # (one sum of all: IREE's vectorizer failed on it)
    return total / loss.numel() if reduction == _MEAN else total
