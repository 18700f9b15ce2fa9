"""Corrections: ops whose IREE 3.13 lowering gives wrong values, traced as equivalents instead.

Most were found by the OpInfo run (tests/opinfo); each declaration says what went wrong. Also here:
the decompositions turbine adds to torch's for ops that torch's own decompositions emit.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from turbine.eager import decompositions
from turbine.eager.registry import Continue, declare
from turbine.eager.scalars import check_fill_value
from turbine.eager.schema import as_call, bound_arguments

_aten = torch.ops.aten


def _squeeze_dims(tensor: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``squeeze.dims`` as a reshape: IREE 3.13 does not know the op, which decompositions emit."""
    dims = {d % max(tensor.dim(), 1) for d in dims}
    shape = [size for d, size in enumerate(tensor.shape) if not (d in dims and size == 1)]
    return torch.ops.aten.reshape.default(tensor, shape)


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


def _promoted(input: Any, *others: Any) -> Any:
    """``input`` in the dtype its bounds promote it to (``clamp(ints, -1.5, 2.5)`` is float32 in
    torch, ``clamp(booleans, 0, 1)`` int64), which torch-mlir did not compile."""
    if not isinstance(input, torch.Tensor):
        return input
    for other in others:
        if isinstance(other, (bool, int, float, torch.Tensor)):
            dtype = torch.result_type(input, other)
            if dtype != input.dtype:
                input = input.to(dtype)
    return input


def _nan_propagating(op: torch._ops.OpOverload) -> Callable:
    """``op`` giving NaN where any tensor argument is NaN, as torch's kernels do.

    IREE 3.13 lowers min/max comparisons as selects that drop a NaN: maximum(nan, 2) gave 2,
    clamp and hardtanh turned NaN into a bound. Booleans go through as bytes: its clamp of a
    boolean tensor by boolean tensors kept the input (clamp(x, max=False) gave x).
    """

    def corrected(*args, **kwargs):
        args = (_promoted(*args), *args[1:])
        result = op(*args, **kwargs)
        if result.dtype == torch.bool:
            as_bytes = lambda v: v.to(torch.uint8) if isinstance(v, torch.Tensor) and v.dtype == torch.bool else v  # noqa: E731
            return op(*map(as_bytes, args), **{k: as_bytes(v) for k, v in kwargs.items()}) != 0
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
        return decompositions.order.at_first_nan(input, dim, keepdim, found)[0]

    return corrected


def _dim_from_the_front(op: torch._ops.OpOverload) -> Callable:
    """``op`` with its dim (the argument after the input) counted from the front: IREE 3.13
    scattered along the wrong dim for any dim below -2 (sort's backward along dim -3 gave wrong
    gradients)."""

    def corrected(input: torch.Tensor, dim: int, *rest: Any, **kwargs: Any) -> torch.Tensor:
        return op(input, dim % max(input.dim(), 1), *rest, **kwargs)

    return corrected


def _decomposed(op: torch._ops.OpOverload) -> Callable:
    """torch's own decomposition of ``op``."""
    return torch._decomp.get_decompositions([op])[op]


_NAN_DROPPING = (
    _aten.maximum.default, _aten.minimum.default, _aten.max.other, _aten.min.other,
    _aten.clamp.default, _aten.clamp.Tensor, _aten.clamp_min.Tensor, _aten.clamp_max.Tensor,
    _aten.clamp_min.default, _aten.clamp_max.default,
)


_clamp_keeping_nan = _nan_propagating(_aten.clamp.default)


def _hardtanh(x: torch.Tensor, min_val: Any = -1.0, max_val: Any = 1.0) -> torch.Tensor:
    """hardtanh as clamp, NaN kept: torch's reference of it branches on the bounds' values for
    integer inputs, which fails to trace once the bounds are runtime numbers."""
    return _clamp_keeping_nan(x, min_val, max_val)


def _convert_element_type(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The one ``prims`` op torch's aten-level decompositions emit (upsampling, grid sampling)."""
    return torch.ops.aten._to_copy.default(x, dtype=dtype)


def _embedding_dense_backward(grad: torch.Tensor, indices: torch.Tensor, *rest: Any) -> torch.Tensor:
    """A lookup of one row by a 0-d index as a lookup of a list of one: IREE 3.13 could not
    compile the gradient of ``embedding(torch.tensor(3))``."""
    if indices.dim() == 0:
        return _aten.embedding_dense_backward.default(grad.reshape(1, -1), indices.reshape(1), *rest)
    return _aten.embedding_dense_backward.default(grad, indices, *rest)


declare(
    _aten.pow.Tensor_Tensor,
    "IREE computes it as exp(log(base) * exponent): NaN for negative bases, 2e-6 off in float32, C's special values wrong",
    correction=decompositions.powers.pow_tensor_tensor,
)
declare(_aten.pow.Tensor_Scalar, "IREE's 0.0 ** -2 was -inf: torch's special exponents, exactly", correction=decompositions.powers.pow_tensor_scalar)


def _integer_power_checked(func: Any, args: tuple, kwargs: dict) -> Continue:
    """torch's kernels refuse an integer tensor to a negative integer power given as a number
    (its shape rule does not): turbine's kernel, which computes integer powers, refuses it too."""
    base, exponent = (list(args) + [kwargs.get("exponent")])[:2]
    integral = not base.dtype.is_floating_point and not base.dtype.is_complex and base.dtype != torch.bool
    if integral and type(exponent) is int and exponent < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    return Continue(args, kwargs)


declare([_aten.pow.Tensor_Scalar, _aten.pow_.Scalar], "an integer tensor to a negative integer power raises torch's error", handler=_integer_power_checked)


def _relu_checked(func: Any, args: tuple, kwargs: dict) -> Continue:
    """torch's kernels refuse relu of booleans (its shape rule does not); turbine's kernel gave
    all False (found by tests/test_fuzz.py)."""
    if (args[0] if args else kwargs["self"]).dtype == torch.bool:
        raise RuntimeError("Boolean inputs not supported for relu")
    return Continue(args, kwargs)


declare([_aten.relu.default, _aten.relu_.default], "relu of booleans raises torch's error", handler=_relu_checked)


def _unsigned_filled(func: Any, args: tuple, kwargs: dict) -> Any:
    """zeros_like, ones_like, new_zeros and new_ones of uint8 as full_like and new_full, whose
    fill value is a kernel input: a uint8 constant does not compile (torch-mlir typed its literal
    si8 against the result's ui8), so these ran on the fallback."""
    if (kwargs.get("dtype") or args[0].dtype) != torch.uint8:
        return Continue(args, kwargs)
    fill = 0 if "zeros" in func.__name__ else 1
    if func in (_aten.zeros_like.default, _aten.ones_like.default):
        return _aten.full_like.default(args[0], fill, **kwargs)
    return _aten.new_full.default(args[0], args[1], fill, **kwargs)


def _left_shift(x: torch.Tensor, amount: Any) -> torch.Tensor:
    """``x << amount`` by its other name: torch runs both with one kernel, and torch-mlir lowers
    only this one (IREE's is exact at every amount, negative or past the width too)."""
    if isinstance(amount, torch.Tensor):
        return _aten.bitwise_left_shift.Tensor(x, amount)
    return _aten.bitwise_left_shift.Tensor_Scalar(x, amount)


def _right_shift(x: torch.Tensor, amount: Any) -> torch.Tensor:
    """``x >> amount`` by its other name (see ``_left_shift``)."""
    if isinstance(amount, torch.Tensor):
        return _aten.bitwise_right_shift.Tensor(x, amount)
    return _aten.bitwise_right_shift.Tensor_Scalar(x, amount)


declare([_aten.__lshift__.Tensor, _aten.__lshift__.Scalar], "torch-mlir does not lower <<", correction=_left_shift)
declare([_aten.__rshift__.Tensor, _aten.__rshift__.Scalar], "torch-mlir does not lower >>", correction=_right_shift)


def _fill_checked(func: Any, args: tuple, kwargs: dict) -> Continue:
    """torch refuses a fill value the dtype cannot hold (``full_like(uint8_image, 256)``); the
    kernel, converting the value, wrapped it."""
    bound = bound_arguments(func, args, kwargs)
    check_fill_value(bound["fill_value"], bound.get("dtype") or bound["self"].dtype)
    return Continue(args, kwargs)


declare([_aten.full_like.default, _aten.new_full.default], "a fill value the dtype cannot hold raises torch's error", handler=_fill_checked)
declare(
    [_aten.zeros_like.default, _aten.ones_like.default, _aten.new_zeros.default, _aten.new_ones.default],
    "a uint8 constant does not compile: uint8 fills take their value as a kernel input",
    handler=_unsigned_filled,
)
for _op in (_aten.leaky_relu_backward.default, _aten.softshrink.default):
    declare(_op, "IREE's lowering took the wrong branch for many elements; torch's decomposition is right", correction=_decomposed(_op))
declare(_aten.select_scatter.default, "IREE 3.13 wrote a negative index to the wrong place", correction=_select_scatter)
declare(_aten.index.Tensor, "IREE reads negative indices as they are, outside the tensor", correction=_index)
declare(_aten.index_put.default, "IREE wrote negative indices outside the tensor (a crash)", correction=_index_put)
declare(_aten.embedding_dense_backward.default, "IREE 3.13 could not compile it for a 0-d index", correction=_embedding_dense_backward)
declare(_aten.renorm.default, "a negative dim renormed the wrong slices", correction=_decomposed(_aten.renorm.default))
for _op in _NAN_DROPPING:
    declare(_op, "IREE lowers min/max comparisons as selects that drop a NaN", correction=_nan_propagating(_op))
declare(
    _aten.hardtanh.default,
    "traced as clamp, NaN kept: IREE drops NaN in min/max selects, and torch's reference branches on the "
    "runtime bounds of integer inputs",
    correction=_hardtanh,
)
for _op in (_aten.argmax.default, _aten.argmin.default):
    declare(_op, "IREE's skipped NaNs; torch's point at the first NaN", correction=_nan_first(_op))
declare(_aten.max.dim, "IREE's index of a slice with a NaN pointed past it", correction=decompositions.order.max_dim)
declare(_aten.min.dim, "IREE's index of a slice with a NaN pointed past it", correction=decompositions.order.min_dim)
for _op, _correction in (
    (_aten.max_pool2d_with_indices.default, decompositions.pooling.max_pool2d_with_indices),
    (_aten.max_pool3d_with_indices.default, decompositions.pooling.max_pool3d_with_indices),
):
    declare(_op, "IREE's indices of a window of -inf at the padding, or of NaNs, pointed outside the input", correction=_correction)
declare(_aten.avg_pool2d.default, "IREE 3.13 pools batched inputs only", correction=decompositions.pooling.avg_pool2d)
declare(_aten.avg_pool3d.default, "IREE 3.13 pools batched inputs only", correction=decompositions.pooling.avg_pool3d)
declare(_aten._adaptive_avg_pool2d.default, "wrong values on CUDA for windows that overlap (area interpolation 4 -> 5)", correction=decompositions.resampling.adaptive_avg_pool2d)
declare(_aten._adaptive_avg_pool3d.default, "wrong values on CUDA for windows that overlap (area interpolation 4 -> 5)", correction=decompositions.resampling.adaptive_avg_pool3d)
declare(
    [_aten.adaptive_max_pool2d.default, _aten.adaptive_max_pool3d.default],
    "IREE's own adaptive max pooling stops at run time unless the sizes divide evenly",
    correction=decompositions.adaptive_max_pool_nd,
)
for _op in (_aten.max_unpool2d.default, _aten.max_unpool3d.default):
    declare(_op, "IREE's lowering dropped values (a width-1 input unpooled to width 3)", correction=_decomposed(_op))
_WIDE_SUMS = "IREE adds float32 reductions in float32: a mean of a million numbers 8.6e-6 off, torch's 2e-8"
for _op, _count in decompositions.accumulation.WIDENED.items():
    declare(_op, _WIDE_SUMS, correction=decompositions.accumulation.in_float64(_op, _count), traits=["refinement"])
declare(
    _aten.linalg_vector_norm.default,
    f"{_WIDE_SUMS}; with a dtype, torch-mlir's max norm kept the input's and did not compile",
    correction=decompositions.accumulation.vector_norm,
    traits=["refinement"],
)
_SOFTMAX_SUM = "IREE adds the sum in float32: a log-softmax over 50257 logits 7e-5 off, torch's 3.7e-6"
_BATCH_STATISTICS = "IREE adds its statistics in float32: a channel of 100352 numbers gave a running mean 9.7e-6 off, torch's 5.5e-8"
for _op, _correction, _reason in (
    (_aten._softmax.default, decompositions.accumulation.softmax, _SOFTMAX_SUM),
    (_aten._log_softmax.default, decompositions.accumulation.log_softmax, _SOFTMAX_SUM),
    (_aten._softmax_backward_data.default, decompositions.accumulation.softmax_backward, _SOFTMAX_SUM),
    (_aten._log_softmax_backward_data.default, decompositions.accumulation.log_softmax_backward, _SOFTMAX_SUM),
    (_aten._native_batch_norm_legit_functional.default, decompositions.accumulation.batch_norm_functional, _BATCH_STATISTICS),
    (_aten._native_batch_norm_legit.no_stats, decompositions.accumulation.batch_norm_no_stats, _BATCH_STATISTICS),
    (
        _aten.native_layer_norm.default,
        decompositions.accumulation.layer_norm,
        "IREE adds its statistics in float32: a row of 200704 numbers 2e-5 off, torch's 1.8e-7",
    ),
):
    declare(_op, _reason, correction=_correction, traits=["refinement"])
declare(_aten.cumsum.default, "IREE's float32 scan adds in float32: 3.5e-5 off after 32000 terms, torch's CPU 5e-8", correction=decompositions.scans.cumsum)
declare(_aten.cumprod.default, "the same for running products", correction=decompositions.scans.cumprod)
declare(_aten.logcumsumexp.default, "IREE's gave inf", correction=decompositions.logcumsumexp)
declare(
    _aten.scatter_reduce.two,
    "IREE rounded an integer mean toward zero, torch rounds it down; it scattered along the wrong dim for a dim below -2",
    correction=decompositions.scatter.scatter_reduce,
)
for _op in (_aten.scatter.src, _aten.scatter.value, _aten.scatter.reduce, _aten.scatter.value_reduce, _aten.scatter_add.default):
    declare(_op, "IREE 3.13 scattered along the wrong dim for a dim below -2", correction=_dim_from_the_front(_op))
declare(
    _aten.upsample_nearest2d_backward.default,
    "IREE's gradient of nearest upsampling by a scale that is not a whole number (1.6, 0.6) added into the wrong places",
    correction=decompositions.resampling.upsample_nearest2d_backward,
)
declare(
    _aten.binary_cross_entropy_with_logits.default,
    "IREE's failed to compile with a per-class weight and a reduction, or with a weight and a pos_weight",
    correction=decompositions.logits.binary_cross_entropy_with_logits,
)
declare(
    _aten.multilabel_margin_loss_forward.default,
    "IREE's (and torch's decomposition) counted the targets after a sample's first -1",
    correction=decompositions.margins.multilabel_margin_loss_forward,
)
declare(
    _aten.multilabel_margin_loss_backward.default,
    "so did its gradient",
    correction=decompositions.margins.multilabel_margin_loss_backward,
)
declare(_aten.rad2deg.default, "IREE's multiplied by 180 / 3.14159: 8.4e-7 relative off", correction=decompositions.trigonometric.rad2deg)
declare(_aten.deg2rad.default, "IREE's was an ulp off for half its results", correction=decompositions.trigonometric.deg2rad)
declare(_aten.tan.default, "IREE's was 3% off near pi/2", correction=decompositions.trigonometric.tan)
declare(_aten.sinc.default, "IREE's took its own sine of pi x: 1e-4 off at 1415.7", correction=decompositions.trigonometric.sinc)
declare(_aten.sin.default, "IREE's reduced the argument badly: sin(100) 5e-6 off, sin(-1e-30) 6e-8", correction=decompositions.trigonometric.sin)
declare(_aten.cos.default, "IREE's reduced the argument badly: cos(100) 1.6e-6 off", correction=decompositions.trigonometric.cos)
declare(_aten.gelu.default, "IREE's tanh form was 5e-5 off", correction=decompositions.trigonometric.gelu)
declare(_aten.lgamma.default, "IREE's float64 one was 3.3e-8 off below 0", correction=decompositions.gamma.float64_lgamma)
declare(_aten.digamma.default, "IREE's float64 one was 2e-11 off", correction=decompositions.gamma.float64_digamma)
declare(_aten.elu.default, "IREE's exp(x) - 1 was 5% off near 0 (selu too)", correction=decompositions.trigonometric.elu)
declare(_aten.celu.default, "IREE's exp(x / alpha) - 1 was wrong near 0", correction=decompositions.trigonometric.celu)
declare(_aten.asinh.default, "IREE's log(x + sqrt(x * x + 1)) was 5% off near 0", correction=decompositions.trigonometric.asinh)
declare(_aten.fmod.Tensor, "IREE's float32 one was x - trunc(x / y) * y as written: wrong from quotients near 1e7 on", correction=decompositions.bits.fmod)
declare(_aten.exp2.default, "IREE's was exp(x log 2): 34 ulps off at -71 in float32, 1e-14 in float64", correction=decompositions.logarithms.exp2)
declare(_aten.log1p.default, "IREE's float64 one was log(1 + x): 0 below 1e-16", correction=decompositions.logarithms.log1p)
declare(_aten.expm1.default, "IREE's float64 one was exp(x) - 1: 0 below 1e-16", correction=decompositions.logarithms.expm1)
declare(_aten.acosh.default, "IREE's log(x + sqrt(x * x - 1)) was 7e-5 off near 1", correction=decompositions.trigonometric.acosh)
declare(_aten.atan.default, "IREE's float32 one was 40 ulps off (2.4e-6 at 0.66); it had no float64 one", correction=decompositions.arctangent.atan)
declare(
    _aten.atan2.default,
    "IREE's was 40 ulps off, and of the wrong sign for atan2(-3, -inf)",
    correction=decompositions.arctangent.atan2,
)
declare(_aten.atanh.default, "IREE's log((1 + x) / (1 - x)) was 30% off near 0", correction=decompositions.trigonometric.atanh)
declare(_aten.sinh.default, "IREE's exp(x) - exp(-x) was 6% off near 0", correction=decompositions.trigonometric.sinh)
declare(_aten.cosh.default, "IREE's overflowed before 89, where torch's is 2.2e38", correction=decompositions.trigonometric.cosh)
declare(_aten.gelu_backward.default, "so was its gradient", correction=_decomposed(_aten.gelu_backward.default))
declare(_aten.ldexp.Tensor, "IREE's was an ulp off (9.2e17 * 2**32 in float32)", correction=decompositions.bits.ldexp)
declare(_aten.neg.default, "IREE negated int32 and int64 through float32: -(2**30 + 1) gave -2**30", correction=decompositions.integers.neg)
declare(_aten.floor_divide.default, "IREE floor-divided int64 through float64 (wrong above 2**53) and could not compile int8", correction=decompositions.integers.floor_divide)
declare(_aten.div.Tensor_mode, "the same for div(rounding_mode='floor'); trunc without the divisions that trap", correction=decompositions.integers.div_mode)
declare(_aten.remainder.Tensor, "an integer division by 0 or of the most negative value by -1 trapped (SIGFPE)", correction=decompositions.integers.remainder)


def _in_common_dtype(func: Any, args: tuple, kwargs: dict) -> Continue:
    """gcd and lcm of operands of two dtypes (an int8 tensor and a 0-d int64 one) in their common
    dtype, as torch casts both first: in a kernel the 0-d operand kept its value (gcd(x, -200)
    of int8 x gave -2 where torch, with -200 wrapped to 56, gives 2). In place, the common dtype
    is the written tensor's."""
    named = bound_arguments(func, args, kwargs)
    in_place = func.overloadpacket in (_aten.gcd_, _aten.lcm_)
    dtype = named["self"].dtype if in_place else torch.result_type(named["self"], named["other"])
    names = ("other",) if in_place else ("self", "other")
    named.update({name: named[name].to(dtype) for name in names})
    return Continue(*as_call(func, named))


declare(
    _aten.addmm.default,
    "IREE multiplied a term whose factor is 0 by 0 (NaN for a NaN or infinity in it), which torch's kernel does not "
    "read; torch-mlir's integer addmm did not legalize its factors",
    correction=decompositions.integers.addmm,
)
declare(
    [_aten.gcd, _aten.gcd_, _aten.lcm, _aten.lcm_],
    "its operands are cast to their common dtype first, as torch casts them, where a kernel kept a 0-d operand's value",
    handler=_in_common_dtype,
)
declare(_aten.sort.default, "IREE's sort placed NaNs anywhere; this orders by an integer key, as torch does", correction=decompositions.order.sort)
declare(_aten.sort.stable, "IREE's sort placed NaNs anywhere; this orders by an integer key, as torch does", correction=decompositions.order.sort_stable)
declare(_aten.topk.default, "IREE's topk placed NaNs anywhere; this orders by an integer key, as torch does", correction=decompositions.order.topk)
declare(
    _aten._native_batch_norm_legit_no_training.default,
    "torch's decomposition gives eval-mode statistics the CPU kernel's shapes, not its shape rule's",
    correction=decompositions.normalization.batch_norm_eval,
)
declare(
    _aten.convolution.default,
    "IREE's strided convolutions ran 8-128x torch's time on the CPU; ones one wide along a dim did not compile",
    correction=decompositions.convolution.convolution,
)
declare(
    _aten.convolution_backward.default,
    "IREE's convolution gradients ran 8-128x torch's time on the CPU; ones one wide along a dim did not compile",
    correction=decompositions.convolution.convolution_backward,
)
for _op, _correction, _why in (
    (_aten.threshold.default, decompositions.activations.threshold, "IREE's gave the value at NaN, torch's keeps NaN"),
    (_aten.threshold_backward.default, decompositions.activations.threshold_backward, "IREE's gave 0 at NaN, torch's passes the gradient"),
    (_aten.hardtanh_backward.default, decompositions.activations.hardtanh_backward, "IREE's passed the gradient at the bounds (relu6 at 0 and 6)"),
    (_aten.hardshrink.default, decompositions.activations.hardshrink, "IREE's gave 0 at NaN, torch's keeps NaN"),
    (_aten.softplus.default, decompositions.activations.softplus, "IREE's float64 one was 0 below -37 (its log1p)"),
    (_aten.softplus_backward.default, decompositions.activations.softplus_backward, "IREE's passed the gradient at NaN, torch's gives NaN"),
):
    declare(_op, _why, correction=_correction)
declare(_aten.squeeze.dims, "IREE 3.13 does not know the op, which torch's decompositions emit", decomposition=_squeeze_dims)
declare(
    torch.ops.prims.convert_element_type.default,
    "the one prims op torch's aten-level decompositions emit (upsampling, grid sampling)",
    decomposition=_convert_element_type,
)
for _op, _correction in decompositions.moments.CORRECTED.items():
    declare(_op, "torch-mlir divides by N - correction as it is: a correction over the count gave a negative variance", correction=_correction)
