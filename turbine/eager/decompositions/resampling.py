"""Resampling one spatial dim at a time: the gradients of upsampling (nearest, linear, cubic);
adaptive average pooling and antialiased resizing, with their gradients.

torch has no decompositions for these ops and IREE 3.13 lowers none of them (adaptive average
pooling it lowers, but see its correction), so every model that resizes (a segmentation head's
bilinear upsampling, a U-Net's nearest one, FPN, torchvision's antialiased Resize) ran them with
the fallback. Each is separable: along each spatial dim, every output place reads a few input
places ("taps") with weights. The forward sums them (``gather``); the gradient spreads each
output's gradient back onto those places (``spread``, an accumulating ``index_put``). The taps
follow torch's CPU kernels (UpSample.h: ``area_pixel_compute_scale``,
``area_pixel_compute_source_index``, the nearest and cubic rules; UpSampleKernel.cpp's
antialiased ones), computed in torch's opmath precision (float32 for float32 and lower, float64
for float64).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from turbine.eager.decompositions._common import registers
from turbine.eager.decompositions.pooling import adaptive_windows

aten = torch.ops.aten

#: A dim's taps: (input index per output place, its weight) pairs.
Taps = list[tuple[torch.Tensor, torch.Tensor]]

_CUBIC_A = -0.75  # torch's cubic convolution coefficient


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scale(size: int, out: int, align_corners: bool, scale: float | None) -> float:
    """torch's ``area_pixel_compute_scale``: input places per output place."""
    if align_corners:
        return (size - 1) / (out - 1) if out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else size / out


def _source(out: int, scale: float, align_corners: bool, cubic: bool, dtype: torch.dtype, device) -> torch.Tensor:
    """torch's ``area_pixel_compute_source_index`` for every output place."""
    place = torch.arange(out, dtype=dtype, device=device)
    if align_corners:
        return place * scale
    source = (place + 0.5) * scale - 0.5
    return source if cubic else source.clamp(min=0)


def _linear(size: int, out: int, align_corners: bool, scale: float | None, dtype: torch.dtype, device) -> Taps:
    source = _source(out, _scale(size, out, align_corners, scale), align_corners, False, dtype, device)
    low = source.floor().to(torch.int64).clamp(max=size - 1)
    fraction = source - low.to(dtype)
    high = (low + 1).clamp(max=size - 1)
    return [(low, 1 - fraction), (high, fraction)]


def _cubic(size: int, out: int, align_corners: bool, scale: float | None, dtype: torch.dtype, device) -> Taps:
    source = _source(out, _scale(size, out, align_corners, scale), align_corners, True, dtype, device)
    low = source.floor()
    t = source - low
    a = _CUBIC_A
    weights = [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]
    low = low.to(torch.int64)
    return [((low + k - 1).clamp(0, size - 1), weight) for k, weight in enumerate(weights)]


def _nearest(exact: bool) -> Callable[..., Taps]:
    def taps(size: int, out: int, align_corners: bool, scale: float | None, dtype: torch.dtype, device) -> Taps:
        """torch's ``nearest_idx`` (``nearest_exact_idx``): the floor of the output place (its
        centre) times the scale, kept inside the input."""
        step = _scale(size, out, False, scale)
        place = torch.arange(out, dtype=torch.float32, device=device) + (0.5 if exact else 0.0)
        index = (place * step).floor().to(torch.int64).clamp(max=size - 1)
        return [(index, torch.ones(out, dtype=dtype, device=device))]

    return taps


def _adaptive(size: int, out: int, align_corners: bool, scale: float | None, dtype: torch.dtype, device) -> Taps:
    """Adaptive average pooling's windows (pooling.adaptive_windows, adaptive max pooling's): each
    window's places read at the widest window's length, the places past its end weighing 0."""
    start, last, widest = adaptive_windows(size, out)
    start, last = start.to(device), last.to(device)
    length = (last + 1 - start).to(dtype)
    return [((start + k).clamp(max=size - 1), torch.where(start + k <= last, 1 / length, torch.zeros_like(length))) for k in range(widest)]


def _triangle(x: torch.Tensor) -> torch.Tensor:
    """The antialiasing filter of bilinear resizing."""
    return (1 - x.abs()).clamp(min=0)


def _keys_cubic(x: torch.Tensor) -> torch.Tensor:
    """The antialiasing filter of bicubic resizing: Keys' cubic with a = -0.5 (PIL's, and torch's
    for antialias=True; the plain bicubic mode's is -0.75)."""
    a, x = -0.5, x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def _antialiased(filter: Callable[[torch.Tensor], torch.Tensor], interp_size: int) -> Callable[..., Taps]:
    def taps(size: int, out: int, align_corners: bool, scale: float | None, dtype: torch.dtype, device) -> Taps:
        """torch's antialiased taps (``_compute_indices_min_size_weights_aa``): when shrinking,
        the filter is stretched by the scale, so each output place averages every input place
        under it; the weights of each place are normalised to sum to 1."""
        step = _scale(size, out, align_corners, scale)
        support = interp_size * 0.5 * step if step >= 1.0 else interp_size * 0.5
        widest = math.ceil(support) * 2 + 1
        stretch = 1.0 / step if step >= 1.0 else 1.0
        centre = (torch.arange(out, dtype=torch.float64, device=device) + 0.5) * step
        first = (centre - support + 0.5).to(torch.int64).clamp(min=0)  # C's truncation, as torch's
        count = ((centre + support + 0.5).to(torch.int64).clamp(max=size) - first).clamp(0, widest)
        places = [first + k for k in range(widest)]
        weights = [torch.where(k < count, filter((place - centre + 0.5) * stretch), 0.0) for k, place in enumerate(places)]
        total = sum(weights)
        total = torch.where(total == 0, 1.0, total)
        return [(place.clamp(max=size - 1), (weight / total).to(dtype)) for place, weight in zip(places, weights)]

    return taps


def spread(grad: torch.Tensor, axis: int, size: int, taps: Taps) -> torch.Tensor:
    """The gradient along ``axis`` moved from the output places onto the input places they read
    (an accumulating ``index_put`` along the front dim: IREE lowers it where it does not lower
    ``index_add``, which a correction's trace keeps as it is)."""
    front = grad.movedim(axis, 0)
    result = torch.zeros((size,) + tuple(front.shape[1:]), dtype=grad.dtype, device=grad.device)
    view = [-1] + [1] * (grad.dim() - 1)
    for index, weight in taps:
        result = torch.index_put(result, (index,), front * weight.to(grad.dtype).reshape(view), accumulate=True)
    return result.movedim(0, axis)


def gather(x: torch.Tensor, axis: int, taps: Taps) -> torch.Tensor:
    """The output places along ``axis``, each the weighted sum of the input places it reads (the
    forward of ``spread``)."""
    front = x.movedim(axis, 0)
    view = [-1] + [1] * (x.dim() - 1)
    result = sum(front.index_select(0, index) * weight.to(x.dtype).reshape(view) for index, weight in taps)
    return result.movedim(0, axis)


def _adaptive_average_forward(op: torch._ops.OpOverload, dims: int) -> Callable:
    def forward(input: torch.Tensor, output_size: list[int]) -> torch.Tensor:
        """Adaptive average pooling (a correction, eager/ops/corrections.py): IREE's own where
        the sizes divide evenly (a plain average pooling); otherwise each output the weighted
        sum of its window's places, one dim at a time. With windows that overlap, area
        interpolation from 4 places to 5 failed the GPU coverage run (not the CPU's), and IREE's
        adaptive max pooling stops at run time for such sizes."""
        spatial = list(input.shape[-dims:])
        if all(size % out == 0 for size, out in zip(spatial, output_size)):
            return op(input, output_size)
        dtype = _opmath(input.dtype)
        result = input.to(dtype)
        for d in range(dims):
            axis = input.dim() - dims + d
            result = gather(result, axis, _adaptive(spatial[d], output_size[d], False, None, dtype, input.device))
        return result.to(input.dtype)

    return forward


adaptive_avg_pool2d = _adaptive_average_forward(aten._adaptive_avg_pool2d.default, 2)
adaptive_avg_pool3d = _adaptive_average_forward(aten._adaptive_avg_pool3d.default, 3)


def _resampled(input: torch.Tensor, output_size: list[int], taps: Callable[..., Taps], align_corners: bool, scales: list) -> torch.Tensor:
    """``input`` resampled along its last ``len(output_size)`` dims, the last first (as torch's
    separable kernels go), in torch's opmath precision."""
    dims = len(output_size)
    dtype = _opmath(input.dtype)
    result = input.to(dtype)
    for d in reversed(range(dims)):
        axis = input.dim() - dims + d
        result = gather(result, axis, taps(input.shape[axis], output_size[d], align_corners, scales[d], dtype, input.device))
    return result.to(input.dtype)


def _resampling_backward(grad: torch.Tensor, input_size: list[int], taps: Callable[..., Taps], align_corners: bool, scales: list) -> torch.Tensor:
    """The input's gradient: ``grad`` spread back along each of the last ``len(scales)`` dims in
    turn, in torch's opmath precision."""
    dims = len(scales)
    spatial = list(input_size[-dims:])
    dtype = _opmath(grad.dtype)
    result = grad.to(dtype)
    for d in range(dims):
        axis = grad.dim() - dims + d
        result = spread(result, axis, spatial[d], taps(spatial[d], grad.shape[axis], align_corners, scales[d], dtype, grad.device))
    return result.to(grad.dtype).reshape(input_size)


def _scales(given: tuple, dims: int) -> list:
    """The op's scale per dim (None where the caller gave none)."""
    return list(given) + [None] * (dims - len(given))


def _interpolating(taps: Callable[..., Taps], dims: int) -> Callable:
    def backward(grad_output, output_size, input_size, align_corners, *scales):
        """The gradient of linear and cubic upsampling: each output's gradient spread onto the
        input places it interpolated, with their weights."""
        return _resampling_backward(grad_output, list(input_size), taps, align_corners, _scales(scales, dims))

    return backward


def _picking(exact: bool, dims: int) -> Callable:
    def backward(grad_output, output_size, input_size, *scales):
        """The gradient of nearest upsampling: each output's gradient added onto the input place
        it copied."""
        return _resampling_backward(grad_output, list(input_size), _nearest(exact), False, _scales(scales, dims))

    return backward


def _adaptive_average(dims: int) -> Callable:
    def backward(grad_output, input):
        """The gradient of adaptive average pooling: each output's gradient shared out evenly
        over its window."""
        return _resampling_backward(grad_output, list(input.shape), _adaptive, False, [None] * dims)

    return backward


def _antialiased_resize(taps: Callable[..., Taps]) -> Callable:
    def forward(input, output_size, align_corners, scales_h=None, scales_w=None):
        """Antialiased resizing (torchvision's Resize on tensors, antialias=True by default):
        each output place the weighted sum of the input places under its stretched filter.
        Integer images are left to torch's kernel, whose fixed-point arithmetic rounds
        differently."""
        if not input.dtype.is_floating_point:
            raise NotImplementedError("torch resizes integer images in fixed point: its kernel runs them")
        return _resampled(input, list(output_size), taps, align_corners, [scales_h, scales_w])

    return forward


def _antialiased_gradient(taps: Callable[..., Taps]) -> Callable:
    def backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        """The gradient of antialiased resizing: each output's gradient spread onto the input
        places under its filter, with their weights."""
        return _resampling_backward(grad_output, list(input_size), taps, align_corners, [scales_h, scales_w])

    return backward


#: nearest2d's gradient, which IREE compiles but gets wrong: a correction (eager/ops/corrections.py).
upsample_nearest2d_backward = _picking(False, 2)

registers(aten.upsample_nearest1d_backward.default)(_picking(False, 1))
registers(aten.upsample_nearest3d_backward.default)(_picking(False, 3))
for _dims, _suffix in ((1, "1d"), (2, "2d"), (3, "3d")):
    registers(getattr(aten, f"_upsample_nearest_exact{_suffix}_backward").default)(_picking(True, _dims))
registers(aten.upsample_linear1d_backward.default)(_interpolating(_linear, 1))
registers(aten.upsample_bilinear2d_backward.default)(_interpolating(_linear, 2))
registers(aten.upsample_trilinear3d_backward.default)(_interpolating(_linear, 3))
registers(aten.upsample_bicubic2d_backward.default)(_interpolating(_cubic, 2))
for _name, _taps in (("bilinear", _antialiased(_triangle, 2)), ("bicubic", _antialiased(_keys_cubic, 4))):
    registers(getattr(aten, f"_upsample_{_name}2d_aa").default)(_antialiased_resize(_taps))
    registers(getattr(aten, f"_upsample_{_name}2d_aa_backward").default)(_antialiased_gradient(_taps))
registers(aten._adaptive_avg_pool2d_backward.default)(_adaptive_average(2))
registers(aten._adaptive_avg_pool3d_backward.default)(_adaptive_average(3))

