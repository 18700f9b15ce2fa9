"""``F.embedding_bag`` (``nn.EmbeddingBag``) on a turbine device, as ops IREE runs.

IREE 3.13 compiles none of aten's embedding_bag ops, and torch has no decomposition of them, so a
text classifier's or recommender's bags fell back, forward and backward. Below autograd they are
hard to replace: the forward's extra outputs (each index's bag, the bag sizes, the rows the
maxima came from) feed the backward op, and torch's CPU and CUDA kernels give them different
meanings. So turbine's function mode (eager/mode.py) hands ``F.embedding_bag`` here, above
autograd, and it is written with ops that autograd differentiates on its own: the rows looked up
with ``embedding``, each index's bag found by a running count of the bag starts, and the rows
summed (``index_add``) or maxed (``scatter_reduce``) into their bags. Indices outside every bag
(past the last offset, or ``padding_idx``) go to one extra bag that is dropped, so they add
nothing and get no gradient.

Arguments are checked as torch checks them, by running ``F.embedding_bag`` on meta tensors (its
errors in its words), and the indices and offsets on the device as for aten's bag ops
(eager/ops/bounds.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from turbine.eager.ops.bounds import checked_bags
from turbine.eager.tensor import DeviceTensor


def embedding_bag(
    input: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> torch.Tensor:
    """``F.embedding_bag`` with ``weight`` on a turbine device: each bag's sum, mean or max of
    its rows (an empty bag's is 0), as torch gives it."""
    options = {"max_norm": max_norm, "norm_type": norm_type, "scale_grad_by_freq": scale_grad_by_freq, "mode": mode}
    options |= {"per_sample_weights": per_sample_weights, "include_last_offset": include_last_offset, "padding_idx": padding_idx}
    _check_as_torch(input, weight, offsets, options)
    if weight.dtype == torch.long and input.is_floating_point():
        input, weight = weight, input  # torch's legacy argument order (it warned on the meta call)
    if sparse and weight.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(
            "embedding_bag(sparse=True) gives the weight a sparse gradient, and turbine devices hold dense "
            "tensors only: pass sparse=False (the optimizer then steps on a dense gradient)"
        )
    bags, indices, bag = _bags(input, offsets, include_last_offset, weight)
    if indices.numel() == 0:
        return torch.zeros((bags, weight.shape[1]), dtype=weight.dtype, device=weight.device)
    rows = F.embedding(indices, weight, max_norm=max_norm, norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    kept = (bag >= 0) & (bag < bags)
    if padding_idx is not None:
        kept = kept & (indices != padding_idx % weight.shape[0])
    return _into_bags(rows, torch.where(kept, bag, bags), kept, bags, mode)


def _bags(input: torch.Tensor, offsets: torch.Tensor | None, include_last_offset: bool, weight: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """How many bags there are, the indices (1-d, checked on the device), and each index's bag."""
    if input.dim() == 2:
        bags, indices, bag = input.shape[0], input.reshape(-1), _rows_as_bags(input, weight.device)
        if isinstance(indices, DeviceTensor):
            indices, _ = checked_bags(indices, None, weight)
        return bags, indices, bag
    bags, indices = offsets.numel() - (1 if include_last_offset else 0), input
    if isinstance(indices, DeviceTensor):
        indices, offsets = checked_bags(indices, offsets, weight)
    return bags, indices, _bag_of_each_index(indices.numel(), offsets, weight.device)


def _into_bags(rows: torch.Tensor, bag: torch.Tensor, kept: torch.Tensor, bags: int, mode: str) -> torch.Tensor:
    """Each bag's sum, mean or max of its rows; rows whose bag is ``bags`` are dropped."""
    width = rows.shape[1]
    empty = torch.zeros((bags + 1, width), dtype=rows.dtype, device=rows.device)
    if mode == "max":
        return empty.scatter_reduce(0, bag.unsqueeze(-1).expand(-1, width), rows, "amax", include_self=False)[:bags]
    sums = empty.index_add(0, bag, rows)[:bags]
    if mode == "sum":
        return sums
    counts = torch.zeros(bags + 1, dtype=rows.dtype, device=rows.device).index_add(0, bag, kept.to(rows.dtype))
    return sums / counts[:bags].clamp(min=1).unsqueeze(-1)


def _check_as_torch(input: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor | None, options: dict) -> None:
    """torch's own argument checks: ``F.embedding_bag`` on meta tensors of the same shapes and
    dtypes raises what it would raise for torch's tensors (and warns as it would)."""

    def meta(value: object) -> object:
        if isinstance(value, torch.Tensor):
            return torch.empty(value.shape, dtype=value.dtype, device="meta")
        return value

    F.embedding_bag(meta(input), meta(weight), meta(offsets), **{k: meta(v) for k, v in options.items()})


def _rows_as_bags(input: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A 2-d input's bag of each index: its row."""
    return torch.arange(input.shape[0], device=device).unsqueeze(-1).expand(input.shape).reshape(-1)


def _bag_of_each_index(count: int, offsets: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The bag each of ``count`` indices falls in: how many bags start at or before it, less one
    (-1 before the first offset; a bag with no indices is counted and skipped over)."""
    starts = torch.zeros(count + 1, dtype=torch.int64, device=device)
    starts = starts.index_put((offsets.to(torch.int64),), torch.ones_like(offsets, dtype=torch.int64), accumulate=True)
    return starts.cumsum(0)[:count] - 1
