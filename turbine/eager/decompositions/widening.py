"""Reductions that widen their input, read through a gather: a second way to lower them, for
IREE 3.13's CUDA target.

That target fails ("failed to distribute") to compile a reduction over the innermost dim whose
input is widened inside the same kernel: a count of booleans or a sum of int32 as int64, a float32
sum accumulated in float64 (eager/decompositions/accumulation.py), a float32 variance (which
torch-mlir accumulates in float64), whenever the reduced size is a multiple of 32. Reading the
widened input through an index_select of 0..n-1 along that dim makes it compile, at any size tried.
The gather costs time, so this is a later alternative (eager/traced_call.py), offered on GPU
targets only and tried where the kernel as traced and decomposed did not compile; :func:`lowering_table` is its
decomposition table, traced with the registry's decompositions (nansum, mse_loss and logsumexp
reach their sums that way).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager.decompositions._common import reduced_dims

aten = torch.ops.aten


def _innermost(input: torch.Tensor, dim: Any) -> bool:
    """Whether a reduction of ``input`` over ``dim`` (a dim, a list, or None and [] for all)
    includes its innermost dim."""
    return input.dim() - 1 in reduced_dims(input, dim)


def _gathered(input: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``input`` as ``dtype``, read through an index_select of every index of its innermost dim."""
    widened = input.to(dtype)
    last = input.dim() - 1
    return widened.index_select(last, torch.arange(widened.shape[last], device=widened.device))


def _accumulated(input: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a sum or product of ``input`` accumulates in: ``dtype``, else int64 for integers
    and booleans, else the input's."""
    if dtype is not None:
        return dtype
    return input.dtype if input.dtype.is_floating_point or input.dtype.is_complex else torch.int64


def _accumulating(op: torch._ops.OpOverload, dim_at: int | None, widens: bool = True) -> Callable[..., Any]:
    """``op`` (whose dim, if it takes one, is its argument ``dim_at``) on its input read through a
    gather (widened first to the dtype it accumulates in, if it ``widens``), where it reduces the
    innermost dim."""

    def rewritten(input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        dim = kwargs.get("dim", args[dim_at - 1] if dim_at is not None and len(args) >= dim_at else None)
        if not _innermost(input, dim):
            return NotImplemented
        dtype = _accumulated(input, kwargs.get("dtype")) if widens else input.dtype
        return op(_gathered(input, dtype), *args, **kwargs)

    return rewritten


def _count_nonzero(input: torch.Tensor, dim: Any = None) -> Any:
    if not _innermost(input, dim):
        return NotImplemented
    return aten.sum.dim_IntList(_gathered(input != 0, torch.int64), [] if dim is None else dim)


def _in_float64(op: torch._ops.OpOverload, with_mean: bool = False) -> Callable[..., Any]:
    """A variance or standard deviation (and, ``with_mean``, the mean: torch-mlir lowers var_mean
    and std_mean only decomposed) in float64, cast back: torch-mlir widens a float32 one inside
    its kernel anyway."""

    def rewritten(input: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
        if not input.dtype.is_floating_point or not _innermost(input, dim):
            return NotImplemented
        wide = _gathered(input, torch.float64)
        results = [op(wide, dim, correction=correction, keepdim=keepdim)]
        if with_mean:
            results.append(aten.mean.dim(wide, list(range(input.dim())) if dim is None else dim, keepdim))
        results = [r.to(input.dtype) for r in results]
        return tuple(results) if with_mean else results[0]

    return rewritten


#: The reductions rewritten: sums, products, means, norms and maxima (whose float32 inputs may have
#: been widened to float64 before them: eager/decompositions/accumulation.py), counts and variances.
_TABLE: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    aten.sum.default: _accumulating(aten.sum.default, None),
    aten.sum.dim_IntList: _accumulating(aten.sum.dim_IntList, 1),
    aten.prod.default: _accumulating(aten.prod.default, None),
    aten.prod.dim_int: _accumulating(aten.prod.dim_int, 1),
    aten.mean.default: _accumulating(aten.mean.default, None),
    aten.mean.dim: _accumulating(aten.mean.dim, 1),
    aten.linalg_vector_norm.default: _accumulating(aten.linalg_vector_norm.default, 2),
    aten.amax.default: _accumulating(aten.amax.default, 1, widens=False),  # logsumexp's float64 one
    aten.count_nonzero.dim_IntList: _count_nonzero,
    aten.count_nonzero.default: _count_nonzero,
    aten.var.correction: _in_float64(aten.var.correction),
    aten.std.correction: _in_float64(aten.std.correction),
    aten.var_mean.correction: _in_float64(aten.var.correction, with_mean=True),
    aten.std_mean.correction: _in_float64(aten.std.correction, with_mean=True),
}


def lowering_table() -> tuple[dict[torch._ops.OpOverload, Callable[..., Any]], Callable[[], bool]]:
    """The decomposition table of this alternative, and a function that says whether a trace
    with it rewrote any reduction (where none did, the alternative is the kernel as traced).
    A rewrite's own reduction is traced as it is."""
    used, active = [], []

    def once(function: Callable[..., Any]) -> Callable[..., Any]:
        def rewrite(*args: Any, **kwargs: Any) -> Any:
            if active:
                return NotImplemented
            active.append(function)
            try:
                result = function(*args, **kwargs)
            finally:
                active.pop()
            if result is not NotImplemented:
                used.append(function)
            return result

        return rewrite

    return {op: once(function) for op, function in _TABLE.items()}, lambda: bool(used)
