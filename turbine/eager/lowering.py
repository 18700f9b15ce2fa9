"""Lowering a Python function over tensors (one aten op, usually) to torch-dialect MLIR.

Traced by kernels_cache/tracing.py; this module says how: the corrections for IREE lowerings
known to be wrong, and the decompositions tried when an op does not compile as it is.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from turbine.eager import decompositions as decompositions_module
from turbine.kernels_cache import tracing
from turbine.kernels_cache.tracing import prepare


def _squeeze_dims(tensor: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``squeeze.dims`` as a reshape: IREE 3.13 does not know the op, which decompositions emit."""
    dims = {d % max(tensor.dim(), 1) for d in dims}
    shape = [size for d, size in enumerate(tensor.shape) if not (d in dims and size == 1)]
    return torch.ops.aten.reshape.default(tensor, shape)


def _pow_tensor_tensor(base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``pow`` with a tensor exponent, right for negative bases.

    IREE computes it as exp(log(base) * exponent): a negative base gave NaN even for an integral
    exponent, where torch gives (-2) ** 2 == 4. The magnitude comes from |base| and the sign
    from the exponent's parity; non-integral powers of negative numbers stay NaN as in torch.
    """
    aten = torch.ops.aten
    result = aten.pow.Tensor_Tensor(base, exponent)
    if not result.dtype.is_floating_point:
        return result
    base, exponent = base.to(result.dtype), exponent.to(result.dtype)
    magnitude = aten.pow.Tensor_Tensor(base.abs(), exponent)
    integral = exponent == exponent.floor()
    odd = aten.remainder.Scalar(exponent, 2) == 1
    negative = torch.where(integral, torch.where(odd, -magnitude, magnitude), torch.full_like(magnitude, float("nan")))
    return torch.where(base < 0, negative, magnitude)


def _select_scatter(input: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    """``select_scatter`` with a non-negative index: IREE 3.13 wrote a negative one to the wrong place."""
    size = input.shape[dim]
    return torch.ops.aten.select_scatter.default(input, src, dim, index + size if index < 0 else index)


def _wrapped_indices(input: torch.Tensor, indices: Sequence) -> list:
    """Index tensors with negative entries counted from the end, as torch reads them.

    IREE's gather and scatter take indices as they are, so a negative one read (or wrote!) outside
    the tensor: index_put with negative indices crashed the process.
    """
    wrapped = []
    for dim, index in enumerate(indices):
        if index is not None and not index.dtype.is_floating_point and index.dtype != torch.bool:
            index = torch.where(index < 0, index + input.shape[dim], index)
        wrapped.append(index)
    return wrapped


def _index(input: torch.Tensor, indices: Sequence) -> torch.Tensor:
    return torch.ops.aten.index.Tensor(input, _wrapped_indices(input, indices))


def _index_put(input: torch.Tensor, indices: Sequence, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    return torch.ops.aten.index_put.default(input, _wrapped_indices(input, indices), values, accumulate)


def _nan_propagating(op: torch._ops.OpOverload) -> Callable:
    """``op`` giving NaN where any tensor argument is NaN, as torch's kernels do.

    IREE 3.13 lowers min/max comparisons as selects that drop a NaN: maximum(nan, 2) gave 2,
    clamp and hardtanh turned NaN into a bound.
    """

    def corrected(*args, **kwargs):
        result = op(*args, **kwargs)
        if not result.dtype.is_floating_point:
            return result
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
                result = torch.where(torch.isnan(value), value.to(result.dtype), result)
        return result

    return corrected


def _nan_first(op: torch._ops.OpOverload) -> Callable:
    """``argmax``/``argmin`` that point at the first NaN, as torch's do (IREE's skipped NaNs)."""

    def corrected(input: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
        found = op(input, dim, keepdim)
        if not input.dtype.is_floating_point:
            return found
        nans = torch.isnan(input).to(torch.int32)
        first_nan = torch.ops.aten.argmax.default(nans, dim, keepdim)
        any_nan = torch.ops.aten.amax.default(nans, [] if dim is None else [dim], keepdim) > 0
        return torch.where(any_nan.reshape(found.shape), first_nan, found)

    return corrected


def _decomposed(op: torch._ops.OpOverload) -> Callable:
    return torch._decomp.decomposition_table[op]


_aten = torch.ops.aten

_NAN_DROPPING = (
    _aten.maximum.default, _aten.minimum.default, _aten.max.other, _aten.min.other,
    _aten.clamp.default, _aten.clamp.Tensor, _aten.clamp_min.Tensor, _aten.clamp_max.Tensor,
    _aten.clamp_min.default, _aten.clamp_max.default, _aten.hardtanh.default,
)

#: Ops whose IREE 3.13 lowering gives wrong values, traced as these equivalents instead. Those
#: found by the OpInfo run (tests/opinfo): ``leaky_relu_backward`` and ``softshrink`` as one op
#: took the wrong branch for many elements; torch's decompositions of them are right. min/max
#: style ops dropped NaNs.
CORRECTIONS = {
    _aten.pow.Tensor_Tensor: _pow_tensor_tensor,
    _aten.leaky_relu_backward.default: _decomposed(_aten.leaky_relu_backward.default),
    _aten.softshrink.default: _decomposed(_aten.softshrink.default),
    _aten.select_scatter.default: _select_scatter,
    _aten.index.Tensor: _index,
    _aten.index_put.default: _index_put,
    _aten.renorm.default: _decomposed(_aten.renorm.default),  # a negative dim renormed the wrong slices
    **{op: _nan_propagating(op) for op in _NAN_DROPPING},
    _aten.argmax.default: _nan_first(_aten.argmax.default),
    _aten.argmin.default: _nan_first(_aten.argmin.default),
    # IREE's own adaptive max pooling stops at run time unless the sizes divide evenly.
    _aten.adaptive_max_pool2d.default: decompositions_module.adaptive_max_pool_nd,
    _aten.adaptive_max_pool3d.default: decompositions_module.adaptive_max_pool_nd,
    _aten.logcumsumexp.default: decompositions_module.logcumsumexp,  # IREE's gave inf
    _aten.tan.default: decompositions_module.trigonometric.tan,  # 3% off near pi/2
    _aten.gelu.default: decompositions_module.trigonometric.gelu,  # the tanh form 5e-5 off
    _aten.gelu_backward.default: _decomposed(_aten.gelu_backward.default),  # so was its gradient
    # IREE's sort and topk placed NaNs anywhere; these order by an integer key, as torch does.
    _aten.sort.default: decompositions_module.order.sort,
    _aten.sort.stable: decompositions_module.order.sort_stable,
    _aten.topk.default: decompositions_module.order.topk,
    # torch's decomposition gives eval-mode statistics the CPU kernel's shapes, not its shape rule's.
    _aten._native_batch_norm_legit_no_training.default: decompositions_module.normalization.batch_norm_eval,
    # IREE's strided convolutions and convolution gradients ran 8-128x torch's time on the CPU.
    _aten.convolution.default: decompositions_module.convolution.convolution,
    _aten.convolution_backward.default: decompositions_module.convolution.convolution_backward,
}

def _convert_element_type(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The one ``prims`` op torch's aten-level decompositions emit (upsampling, grid sampling)."""
    return torch.ops.aten._to_copy.default(x, dtype=dtype)


#: torch decompositions outside the core-aten set that trace into ops IREE compiles. Chosen by
#: name: the rest of torch's full table also decomposes ops IREE runs as they are (``_to_copy``
#: among them, which the converter below needs intact).
_MORE_FROM_TORCH = (
    "_batch_norm_with_update", "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "native_batch_norm",
    "max_pool2d_with_indices", "max_pool3d_with_indices",
    "max_pool2d_with_indices_backward", "grid_sampler_2d", "upsample_bicubic2d", "upsample_bilinear2d",
    "upsample_trilinear3d", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "addmv", "dist", "_euclidean_dist", "as_strided_copy", "narrow_copy", "permute_copy", "unbind_copy", "view_copy",
)


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """The second try for an op IREE cannot compile as it is.

    torch's core-aten decompositions, then a few more of torch's (max pooling with indices,
    upsampling, the ``*_copy`` ops), then turbine's own (eager/decompositions.py), which win.
    """
    table = {
        op: fn
        for op, fn in torch._decomp.decomposition_table.items()
        if getattr(op, "_opname", None) in _MORE_FROM_TORCH and not fn.__module__.startswith("torch._refs")
    }
    table.update(torch._decomp.core_aten_decompositions())
    table[torch.ops.aten.squeeze.dims] = _squeeze_dims
    table[torch.ops.prims.convert_element_type.default] = _convert_element_type
    table.update(decompositions_module.TABLE)
    return table


def lower(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]], decompose: bool = False) -> str:
    """MLIR text of ``fn`` traced on inputs of the given (sizes, dtype), with turbine's
    decompositions when ``decompose`` (the second try for an op that does not compile as it is)."""
    return tracing.lower(fn, inputs, decompositions() if decompose else None)


__all__ = ["CORRECTIONS", "decompositions", "lower", "prepare"]
