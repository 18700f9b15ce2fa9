"""Variances and standard deviations with torch's divisor, ``max(0, N - correction)``.

torch-mlir divides the sum of squared deviations by ``N - correction`` as it is, so a correction
larger than the count (``x.var(1, correction=5)`` of rows of 3) gave a negative variance and a
NaN standard deviation, where torch's kernels divide by 0: inf, or NaN where every number equals
the mean. Where ``N - correction`` cannot be negative the op is traced as it is; else the sum of
squares is recovered from the biased variance and divided by the clamped divisor, in float64 for
float32 and narrower inputs (torch-mlir widens a float32 variance inside its kernel too).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from turbine.eager.decompositions._common import reduced_dims

aten = torch.ops.aten

#: The least size a dynamic kernel's dim takes (eager/dynamic.py): its traces see symbolic sizes
#: of at least 2, so a correction of at most this cannot outgrow the count there.
_LEAST_DYNAMIC_SIZE = 2


def _may_outgrow(input: torch.Tensor, dims: list[int], correction: float) -> bool:
    """Whether ``correction`` may exceed the count of numbers each result reduces."""
    sizes = [input.shape[d] for d in dims]
    if all(isinstance(size, int) for size in sizes):
        return correction > math.prod(sizes)
    return correction > _LEAST_DYNAMIC_SIZE


def _clamped(input: torch.Tensor, dims: list[int], correction: float, keepdim: bool) -> torch.Tensor:
    """The variance over ``dims`` with the divisor ``max(0, N - correction)``, N counted as a
    tensor so that a shape-generic kernel's trace does not branch on it."""
    wide = input.to(torch.float64) if input.dtype.itemsize <= 4 else input
    count = aten.sum.dim_IntList(torch.ones_like(wide), dims, keepdim)
    squares = aten.var.correction(wide, dims, correction=0, keepdim=keepdim) * count
    return (squares / torch.clamp_min(count - correction, 0)).to(input.dtype)


def corrected(op: torch._ops.OpOverload, *, root: bool = False, with_mean: bool = False) -> Callable[..., Any]:
    """``op`` (a variance, or with ``root`` a standard deviation; ``with_mean``, and the mean) as
    torch computes it, whatever the correction."""

    def moment(input: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
        correction = 1 if correction is None else correction
        dims = reduced_dims(input, dim)
        if not input.dtype.is_floating_point or not _may_outgrow(input, dims, correction):
            return op(input, dim, correction=correction, keepdim=keepdim)
        variance = _clamped(input, dims, correction, keepdim)
        result = torch.sqrt(variance) if root else variance
        return (result, aten.mean.dim(input, dims, keepdim)) if with_mean else result

    moment.__doc__ = f"{op} with torch's divisor, max(0, N - correction)."
    return moment


#: The ops corrected, each with its correction.
CORRECTED: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    aten.var.correction: corrected(aten.var.correction),
    aten.std.correction: corrected(aten.std.correction, root=True),
    aten.var_mean.correction: corrected(aten.var_mean.correction, with_mean=True),
    aten.std_mean.correction: corrected(aten.std_mean.correction, root=True, with_mean=True),
}
