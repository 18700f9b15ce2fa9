"""Large float reductions accumulated in float64, their results rounded once to torch's dtype.

IREE 3.13 adds a float32 reduction in float32, in order along each vector lane, so its error grows
with the count: on turbine:cpu a sum or mean of a million numbers in [0.5, 1.5) came out 8.6e-6
relative off (torch's CPU kernel, which adds in a cascade, 2e-8), the 2-norm of 6.4 million 2e-3
(torch 2.4e-5), an MSE loss over them 4e-3 (torch 1.4e-8), a log-softmax over 50257 logits (a
language model's vocabulary) 7e-5 (torch 3.7e-6). Losses, norms and normalisations of large
tensors are where training reads such sums.

Here a reduction of at least :data:`LARGE` numbers adds in float64, whose 53 bits hold such sums to
well under a float32 ulp, and rounds once: as close as torch's or closer (a shape-generic kernel
counts its fixed sizes only, and a large call it does not serve gets a kernel of its own).
Smaller ones are traced as they were (their error is a few ulps): float64 arithmetic cost IREE's
CPU kernels up to 3.5 times their time (a row sum of 64x50257), and exp in float64 10 times, so
softmax, layer norm and batch norm widen only their sums. IREE 3.13's CUDA target compiles a float64 sum over the innermost dim of a widened
input only when the input is read through a gather (eager/decompositions/widening.py, the next
lowering tried). Each is declared a "refinement" (eager/registry.py): where a target compiles
none of these, the op as IREE lowers it runs instead.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Callable, Iterator

import torch

from turbine.eager.decompositions._common import reduced_dims

aten = torch.ops.aten

#: The dtype large sums are accumulated in.
WIDE = torch.float64
#: The count of numbers from which a reduction is accumulated in float64.
LARGE = 1024


_symbolic = threading.local()


def _known(sizes: Any) -> int:
    """The product of ``sizes`` that are numbers. A shape-generic kernel's symbolic sizes count
    as 1 (its trace must not branch on them), so its reductions over them add as small ones;
    such a trace is noted (:func:`noting_symbolic_counts`), and eager/op_trace.py serves a call
    from its kernel only where the call's own trace is the same program: a large one gets a
    kernel of its own, which adds in float64 (served by the kernel, a sum of 16M numbers came
    out 11% off)."""
    sizes = list(sizes)
    numbers = [size for size in sizes if isinstance(size, int)]
    if len(numbers) < len(sizes):
        _symbolic.counted = True
    return math.prod(numbers)


@contextlib.contextmanager
def noting_symbolic_counts() -> Iterator[list[bool]]:
    """Within: whether the traces on this thread counted a symbolic size, as a list that holds
    True once the block is left where one did."""
    outer, _symbolic.counted = getattr(_symbolic, "counted", False), False
    noted: list[bool] = []
    try:
        yield noted
    finally:
        if _symbolic.counted:
            noted.append(True)
        _symbolic.counted = outer


def _large(count: int) -> bool:
    return count >= LARGE


def _over(input: torch.Tensor, dim: Any = None) -> int:
    """How many numbers a reduction of ``input`` over ``dim`` (a dim, a list, or None and [] for
    all) adds for each result, as far as its sizes are known."""
    return _known(input.shape[d] for d in reduced_dims(input, dim))


def _per_channel(input: torch.Tensor, *rest: Any, **kwargs: Any) -> int:
    """How many numbers batch norm adds for each channel (dim 1)."""
    return _known(size for d, size in enumerate(input.shape) if d != 1)


def _reduced(input: torch.Tensor, target: torch.Tensor, reduction: int = 1) -> int:
    """How many numbers a loss with ``reduction`` (0: none) adds: all of them, or none."""
    return _known(input.shape) if reduction else 0


def _widened(value: Any) -> Any:
    """A float tensor as float64; anything else (integer tensors, numbers, dims) as it is."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != WIDE:
        return value.to(WIDE)
    return value


def in_float64(op: torch._ops.OpOverload, count: Callable[..., Any]) -> Callable[..., Any]:
    """``op``, where ``count(*args, **kwargs)`` is large, on its float tensor arguments widened to
    float64, a float ``dtype=`` argument too (``sum(x, dtype=torch.float32)`` would otherwise
    narrow the input again); the traced kernel rounds its results to the op's dtypes
    (eager/traced_call.py)."""

    def widened(*args: Any, **kwargs: Any) -> Any:
        dtype = kwargs.get("dtype")
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point and not args[0].dtype.is_floating_point:
            args = (args[0].to(dtype), *args[1:])  # a mean of integers: torch-mlir does not compile it
        if not _large(count(*args, **kwargs)):
            return op(*args, **kwargs)
        if isinstance(kwargs.get("dtype"), torch.dtype) and kwargs["dtype"].is_floating_point:
            kwargs = {**kwargs, "dtype": WIDE}
        return op(*[_widened(a) for a in args], **{k: _widened(v) for k, v in kwargs.items()})

    widened.__doc__ = f"{op}, accumulated in float64 where it adds at least {LARGE} numbers."
    return widened


#: The ops corrected by :func:`in_float64`, with how many numbers each adds: sums and means (norms:
#: :func:`vector_norm`), the losses whose aten op reduces inside, and batch norm's gradient (the
#: weight's and bias's, sums over the batch, were 1e-5 off). Batch norm itself: :func:`batch_norm_functional`.
WIDENED: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    aten.sum.default: lambda input, **_: _over(input),
    aten.sum.dim_IntList: lambda input, dim, *_, **__: _over(input, dim),
    aten.mean.default: lambda input, **_: _over(input),
    aten.mean.dim: lambda input, dim, *_, **__: _over(input, dim),
    aten.nansum.default: lambda input, dim=None, *_, **__: _over(input, dim),
    aten.logsumexp.default: lambda input, dim, *_: _over(input, dim),
    aten.mse_loss.default: _reduced,
    aten.native_batch_norm_backward.default: lambda grad, input, *_: _per_channel(input),
}


_wide_norm = in_float64(aten.linalg_vector_norm.default, lambda input, ord, dim, keepdim: _over(input, dim))


def vector_norm(input: torch.Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> torch.Tensor:
    """``linalg_vector_norm`` of ``input`` cast to ``dtype`` first, as torch defines it (torch-mlir's
    max norm, ord +-inf, kept the input's dtype and did not compile: renorm's gradient asks for
    float64), accumulated in float64 where it adds many numbers (:func:`in_float64`)."""
    if dtype is not None and dtype != input.dtype and not input.dtype.is_complex:
        input = input.to(dtype)
    return _wide_norm(input, ord, dim, keepdim)


def _sum_wide(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` summed along ``dim`` in float64, rounded back to x's dtype, the dim kept."""
    return x.sum(dim, keepdim=True, dtype=WIDE).to(x.dtype)


def softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """``_softmax``: exp(x - max) / sum, a large sum accumulated in float64."""
    if not _large(_over(x, dim)):
        return aten._softmax.default(x, dim, half_to_float)
    exps = (x - x.amax(dim, keepdim=True)).exp()
    return exps / _sum_wide(exps, dim)


def log_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """``_log_softmax``: (x - max) - log(sum(exp(x - max))), a large sum accumulated in float64."""
    if not _large(_over(x, dim)):
        return aten._log_softmax.default(x, dim, half_to_float)
    shifted = x - x.amax(dim, keepdim=True)
    return shifted - shifted.exp().sum(dim, keepdim=True, dtype=WIDE).log().to(x.dtype)


def softmax_backward(grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
    """``_softmax_backward_data``: output * (grad - sum(grad * output)), a large sum in float64."""
    if not _large(_over(grad, dim)):
        return aten._softmax_backward_data.default(grad, output, dim, input_dtype)
    return output * (grad - _sum_wide(grad * output, dim))


def log_softmax_backward(grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
    """``_log_softmax_backward_data``: grad - exp(output) * sum(grad), a large sum in float64."""
    if not _large(_over(grad, dim)):
        return aten._log_softmax_backward_data.default(grad, output, dim, input_dtype)
    return grad - output.exp() * _sum_wide(grad, dim)


def layer_norm(
    input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``native_layer_norm``, a large row's mean and variance accumulated in float64 (IREE's over
    200704 numbers a row was 2e-5 off, torch's 1.8e-7), the normalisation in the input's dtype."""
    if not _large(_known(normalized_shape)):
        return aten.native_layer_norm.default(input, normalized_shape, weight, bias, eps)
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    mean = input.mean(dims, keepdim=True, dtype=WIDE).to(input.dtype)
    centred = input - mean
    rstd = ((centred * centred).mean(dims, keepdim=True, dtype=WIDE) + eps).rsqrt().to(input.dtype)
    output = centred * rstd
    if weight is not None:
        output = output * weight
    if bias is not None:
        output = output + bias
    return output, mean, rstd


def batch_norm_functional(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, ...]:
    """``_native_batch_norm_legit_functional`` (what a kernel of ``_native_batch_norm_legit``
    traces: eager/ops/normalization.py): in training, with large channels, :func:`_normalized`,
    the running statistics updated as torch does (the variance unbiased)."""
    if not training or not _large(_per_channel(input)):
        return aten._native_batch_norm_legit_functional.default(input, weight, bias, running_mean, running_var, training, momentum, eps)
    output, mean, rstd, wide_mean, wide_variance = _normalized(input, weight, bias, eps)
    count = _count(input)
    new_mean = momentum * wide_mean + (1 - momentum) * running_mean.to(WIDE)
    new_var = momentum * (wide_variance * (count / (count - 1))) + (1 - momentum) * running_var.to(WIDE)
    return output, mean, rstd, new_mean.to(running_mean.dtype), new_var.to(running_var.dtype)


def batch_norm_no_stats(
    input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, training: bool, momentum: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_native_batch_norm_legit.no_stats`` (batch norm without running statistics, instance
    norm): with large channels, :func:`_normalized`."""
    if not _large(_per_channel(input)):
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    return _normalized(input, weight, bias, eps)[:3]


def _count(input: torch.Tensor) -> Any:
    """How many numbers each channel (dim 1) has, symbolic sizes included."""
    count = 1
    for d, size in enumerate(input.shape):
        if d != 1:
            count = count * size
    return count


def _normalized(
    input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, ...]:
    """Batch norm in training: the output, each channel's mean and 1/std, and (in float64) its mean
    and biased variance. The statistics add in float64, the mean first, then the squares of the
    values less it (two passes: the mean of the squares less the squared mean loses the variance
    of values far from 0); everything elementwise stays in float32. The whole op in float64 took
    turbine:cpu 46.7 ms for 32x64x56x56 numbers, this 30.8 ms (float32 alone 20.3 ms)."""
    dims = [0, *range(2, input.dim())]
    work = input if input.dtype in (torch.float32, torch.float64) else input.to(torch.float32)
    count = _count(input)
    wide_mean = work.sum(dims, keepdim=True, dtype=WIDE) / count
    mean = wide_mean.to(work.dtype)
    centred = work - mean
    variance = (centred * centred).sum(dims, keepdim=True, dtype=WIDE) / count
    rstd = (variance + eps).rsqrt().to(work.dtype)
    output = centred * rstd
    channels = [1, input.shape[1], *[1] * (input.dim() - 2)]
    if weight is not None:
        output = output * weight.reshape(channels)
    if bias is not None:
        output = output + bias.reshape(channels)
    flat = [input.shape[1]]
    return output.to(input.dtype), mean.reshape(flat), rstd.reshape(flat), wide_mean.reshape(flat), variance.reshape(flat)
