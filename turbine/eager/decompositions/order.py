"""Order statistics by sorting: sort and topk with torch's NaN order, median, nanmedian,
kthvalue.

IREE 3.13's sort and topk compare floats as they are, so a NaN landed anywhere; torch puts
NaN above +inf. Sorting an integer key that orders like torch's floats fixes both, and the
statistics read the sorted values at their ranks.

On CUDA, IREE 3.13 fails to bufferize a sort (or topk) whose sorted keys go unused ("failed to
bufferize op"), which a sort that only wanted the permutation was. So each result here is read
from the sorted keys themselves; see ``_values``.
"""

from __future__ import annotations

import math

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten


def order_key(input: torch.Tensor) -> torch.Tensor:
    """Integers that order as torch orders floats: NaN above +inf, -0.0 equal to 0.0.

    IREE 3.13's sort and topk compare floats as they are, so a NaN landed anywhere. Reading the
    bits as a signed integer orders positive floats already; flipping the other bits of negative
    ones orders those too. Booleans are keyed as bytes: IREE 3.13 sorted True before False.
    """
    if input.dtype == torch.bool:
        return input.to(torch.uint8)
    if not input.dtype.is_floating_point:
        return input
    if input.dim() == 0:  # IREE 3.13 cannot reinterpret a 0-d tensor
        return order_key(input.reshape(1)).reshape(())
    canonical = torch.where(input == 0, torch.zeros_like(input), input)
    canonical = torch.where(torch.isnan(input), torch.full_like(input, math.nan), canonical)
    width = input.element_size() * 8
    bits = canonical.view({64: torch.int64, 32: torch.int32}.get(width, torch.int16))
    return torch.where(bits < 0, _flipped(bits), bits)


def _flipped(bits: torch.Tensor) -> torch.Tensor:
    """A negative float's key from its bits, and its bits from its key (the map is its own inverse).

    The bits are lowest + magnitude, the key -magnitude - 1: (-1 - bits) + lowest, with no xor
    in IREE 3.13 and no negation (decompositions.integers: IREE negated integers through float32).
    """
    lowest = -(1 << (bits.element_size() * 8 - 1))
    return (-1 - bits) + lowest


def _values(input: torch.Tensor, keys: torch.Tensor, indices: torch.Tensor, dim: int) -> torch.Tensor:
    """The input's values at ``indices``, read from their sorted order keys ``keys``.

    IREE 3.13's CUDA target cannot compile a sort whose sorted keys are dead, so they must feed
    the result. Integers are their own keys and booleans' keys are bytes; a float key decodes to
    the float's bits exactly except where order_key made it canonical (zeros and NaNs), which are
    gathered from the input so that -0.0 and a NaN's bits come back as they went in.
    """
    if input.dtype == torch.bool:
        return keys.to(torch.bool)
    if not input.dtype.is_floating_point:
        return keys
    if keys.dim() == 0:  # IREE 3.13 cannot reinterpret a 0-d tensor
        return _values(input.reshape(1), keys.reshape(1), indices.reshape(1), 0).reshape(())
    decoded = torch.where(keys < 0, _flipped(keys), keys).view(input.dtype)
    canonical = (decoded == 0) | torch.isnan(decoded)
    return torch.where(canonical, torch.gather(input, dim, indices), decoded)


def sort(input: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``sort`` by the order key; IREE's sort keeps equal keys in order, so it is also stable."""
    if input.dim() == 0:
        return input.clone(), torch.zeros((), dtype=torch.int64)
    keys, indices = torch.ops.aten.sort.default(order_key(input), dim, descending)
    return _values(input, keys, indices, dim), indices


def sort_stable(input: torch.Tensor, *, stable: bool | None = None, dim: int = -1, descending: bool = False):
    """``sort.stable``, which IREE 3.13 does not know: the same sort, which is stable anyway."""
    return sort(input, dim, descending)


def topk(input: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """``topk`` by the order key, so a NaN counts as the largest value, as in torch. Always in
    order: IREE 3.13 compiles no ``sorted=False`` topk, and the top k in order are a valid answer
    to it (torch's own order there is its kernel's; DeepSeek's and other MoE routers ask for it)."""
    keys, indices = torch.ops.aten.topk.default(order_key(input), k, dim, largest, True)
    return _values(input, keys, indices, dim), indices


def _ranked(input: torch.Tensor, dim: int, rank: torch.Tensor | int, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The value of the given rank (0-based, in torch's order, NaN last) along dim, and its index."""
    if input.dim() == 0:
        return input.clone(), torch.zeros((), dtype=torch.int64)
    values, indices = sort(input, dim)
    if isinstance(rank, int):
        value, index = values.narrow(dim, rank, 1), indices.narrow(dim, rank, 1)
    else:
        value, index = torch.gather(values, dim, rank), torch.gather(indices, dim, rank)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def _valid(input: torch.Tensor, dim: int) -> torch.Tensor:
    """How many non-NaN values each slice along dim holds (kept as a size-1 dim)."""
    if not input.dtype.is_floating_point:
        return torch.full_like(input.narrow(dim, 0, 1), input.shape[dim], dtype=torch.int64)
    return (~torch.isnan(input)).sum(dim, keepdim=True)


@registers(aten.kthvalue.default)
def kthvalue(input: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False):
    return _ranked(input, dim, k - 1, keepdim)


@registers(aten.median.dim)
def median_dim(input: torch.Tensor, dim: int, keepdim: bool = False):
    """The lower median; a slice with a NaN gives its first NaN (NaNs sort last, stably)."""
    if input.dim() == 0:
        return _ranked(input, dim, 0, keepdim)
    valid = _valid(input, dim)
    rank = torch.where(valid < input.shape[dim], valid, (input.shape[dim] - 1) // 2)
    return _ranked(input, dim, rank, keepdim)


@registers(aten.nanmedian.dim)
def nanmedian_dim(input: torch.Tensor, dim: int, keepdim: bool = False):
    """The lower median of the non-NaN values (the first NaN where there are none)."""
    if input.dim() == 0:
        return _ranked(input, dim, 0, keepdim)
    rank = torch.clamp(torch.div(_valid(input, dim) - 1, 2, rounding_mode="floor"), min=0)
    return _ranked(input, dim, rank, keepdim)


@registers(aten.median.default)
def median(input: torch.Tensor) -> torch.Tensor:
    if input.numel() == 0:
        return torch.full((), math.nan, dtype=input.dtype)
    return median_dim(input.reshape(-1), 0)[0]


@registers(aten.nanmedian.default)
def nanmedian(input: torch.Tensor) -> torch.Tensor:
    if input.numel() == 0:
        return torch.full((), math.nan, dtype=input.dtype)
    return nanmedian_dim(input.reshape(-1), 0)[0]


def at_first_nan(input: torch.Tensor, dim: int | None, keepdim: bool, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``index``, or the first NaN's index along ``dim`` where that slice holds a NaN (torch's rule
    for argmax, argmin, max.dim and min.dim; IREE's skipped NaNs), and where the slices hold one."""
    nans = torch.isnan(input).to(torch.int32)
    any_nan = aten.amax.default(nans, [] if dim is None else [dim], keepdim) > 0
    return torch.where(any_nan.reshape(index.shape), aten.argmax.default(nans, dim, keepdim), index), any_nan


def _extreme(largest: bool):
    def extreme(input: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``max.dim`` / ``min.dim`` with torch's rules: a slice holding a NaN has NaN for its value
        and its first NaN's index (IREE's kept NaN as the value but pointed elsewhere, so max
        pooling's indices fell outside the input), and ties give the first index."""
        work = input.to(torch.int8) if input.dtype == torch.bool else input
        floating = work.dtype.is_floating_point
        if floating:
            work = torch.where(torch.isnan(work), -math.inf if largest else math.inf, work)
        best = (aten.amax.default if largest else aten.amin.default)(work, [dim], True)
        index = aten.argmax.default((work == best).to(torch.int32), dim, keepdim)
        values = best if keepdim else best.squeeze(dim)
        if floating:
            index, any_nan = at_first_nan(input, dim, keepdim, index)
            values = torch.where(any_nan, math.nan, values)
        return values.to(input.dtype), index

    return extreme


max_dim = registers(aten.max.dim)(_extreme(largest=True))
min_dim = registers(aten.min.dim)(_extreme(largest=False))
