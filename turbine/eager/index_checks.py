"""Index checks: each index an op takes is checked against the size it indexes, on the device
(and the few values whose range a GPU kernel asserts on, such as probabilities: ``checked_values``).

IREE's kernels neither check nor clamp an index (torch-mlir's asserts are dropped inside
dispatches): an index out of range read or wrote outside its tensor, and a large one crashed the
process. So each index tensor of an op that takes indices (eager/ops/bounds.py lists them, with
torch's rules and errors) first goes through one small kernel, which gives

- the index with every entry outside its range replaced by 0 and every negative one (where the
  op allows them) counted from the end, so that the op's own kernel reads and writes only inside
  its tensors; and
- a report of three numbers: how many entries were out of range, the first of them, and its
  position (torch names it in some errors).

The device keeps the report, and the next read from it (``.cpu()``, ``.item()``, printing,
``turbine.synchronize()``) reads it and raises torch's error for the op, as CUDA reports
device-side asserts; the op's results are then not to be trusted. ``TURBINE_CHECK_INDICES=eager``
reads each report at its op instead, which raises where torch's CPU kernels do but waits for
the device at every indexing op.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from turbine.config import choice
from turbine.eager.dtypes import ELEMENT_TYPES
from turbine.eager.lowering import lower
from turbine.eager.scalars import int_vector
from turbine.eager.tensor import DeviceTensor, wrap
from turbine.eager.views import dense
from turbine.device import ready_fence, view_of
from turbine.kernels_cache import kernel_cache
from turbine.kernels_cache.tracing import Dynamic

#: How a check names an out-of-range entry: (its value, its position in the flattened index) ->
#: torch's error for the op.
Error = Callable[[int, int], BaseException]

#: The values ``TURBINE_CHECK_INDICES`` takes.
MODES = ("lazy", "eager")

#: No entry equals this (an ``ignore`` value for checks that have none).
_NEVER = -(2**63)


def checked(index: DeviceTensor, low: int, high: int, error: Error, ignore: int = _NEVER) -> DeviceTensor:
    """``index`` with entries outside ``[low, high)`` (other than ``ignore``) replaced by 0, and
    negative ones counted from the end (where ``low`` < 0); the device reports the first entry out
    of range through ``error`` at its next read."""
    mode = choice("check_indices", MODES)
    count = index.numel()
    if count == 0 or index.dtype not in (torch.int64, torch.int32):
        return index
    if index.dtype == torch.int32:  # checked as int64: the int32 kernel did not compile for cuda (IREE 3.13)
        return checked(index.to(torch.int64), low, high, error, ignore).to(torch.int32)
    source = dense(index)
    device = source._storage.device
    kernel = _kernel(count, device)
    inputs = [view_of(source._storage.buffer, [count], ELEMENT_TYPES[source.dtype]), int_vector(device, (low, high, ignore))]
    (safe, _), (report, _) = kernel.launch(inputs, ready_fence([source._storage.buffer]))
    device.expect(report, lambda raw: _error(raw, error))
    if mode == "eager":
        device.raise_expected()
    return wrap(safe, index.dtype, tuple(index.shape))


def checked_values(values: DeviceTensor, low: float, high: float, error: Error) -> DeviceTensor:
    """``values`` (floating) with entries outside ``[low, high]`` (NaN among them) replaced by
    ``low``; the device reports the first such entry's position through ``error`` (its value is
    given as 0) at its next read. For ops whose GPU kernels assert on a value out of range (which
    loses the CUDA context) where torch's CPU kernels raise: binary_cross_entropy's probabilities.
    Made of plain ops and the int64 index check: a check kernel of its own, reducing float32 to
    int64 positions, did not compile for cuda (IREE 3.13: "failed to distribute")."""
    if values.numel() == 0 or not values.dtype.is_floating_point:
        return values
    inside = (values >= low) & (values <= high)
    checked(inside.reshape(-1).to(torch.int64), 1, 2, error)  # an entry of 0 is outside
    return torch.where(inside, values, torch.full_like(values, low))


def _error(raw: np.ndarray, error: Error) -> BaseException | None:
    bad, value, position = raw.view(np.int64)[:3]
    return error(int(value), int(position)) if bad else None


def _kernel(count: int, device) -> object:
    """The check's kernel (int64 indices): one for every count of 2 or more, one for 1."""
    length = Dynamic("n", 16) if count >= 2 else 1

    def check(index: torch.Tensor, bounds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ignored = index == bounds[2]
        bad = ~(((index >= bounds[0]) & (index < bounds[1])) | ignored)
        # A negative index counts from the end where the op allows it (``low`` < 0): made so here,
        # since IREE's index_fill wrote a -1 before its tensor instead of at its end.
        wrapped = torch.where((index < 0) & (bounds[0] < 0) & ~ignored, index + bounds[1], index)
        safe = torch.where(bad, 0, wrapped)
        positions = torch.arange(index.shape[0], dtype=torch.int64)
        first = torch.where(bad, positions, index.shape[0]).amin()
        value = torch.where(positions == first, index, 0).sum()  # the first bad entry (no gather: 0-d indices do not trace)
        return safe, torch.stack([bad.sum(), value, first])

    return kernel_cache.kernel(
        ("turbine.index_check", 5, "any" if count >= 2 else 1),
        device,
        lambda: lower(check, [((length,), torch.int64), ((3,), torch.int64)]),
        "index check",
        {"dynamic": True} if count >= 2 else None,
    )
