"""Max pooling with torch's indices, adaptive max pooling for any input and output sizes, average
pooling of unbatched inputs and of inputs whose ends its windows leave unread, and the
gradients of average pooling and of max pooling at its indices."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch._meta_registrations import pooling_output_shape

from turbine.eager.decompositions._common import registers, shape_rule

aten = torch.ops.aten

def _max_pool_with_indices(op: torch._ops.OpOverload, dims: int):
    def max_pool(input: torch.Tensor, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        """Max pooling with torch's indices (a correction, eager/ops/corrections.py): IREE's
        lowering pads with -inf, so a window of -inf that overlapped the padding picked a padded
        place, an index outside the input (torch's kernels pick the window's first element
        inside), and a window of NaNs gave -1. This is IREE's own pooling of an input whose -inf
        are raised to the lowest float and whose NaNs to +inf, so that no input ties with the
        padding and a NaN wins its window; the values are read from the input at the indices. A
        window with several NaNs points at one of them (torch's kernels, at the last): either is
        inside the input, and holds NaN. (torch 2.13's own decomposition would do too, but torch
        2.11, the GPU machine's, has none.)"""
        lifted = input
        if input.dtype.is_floating_point:
            lifted = torch.where(input == -math.inf, torch.finfo(input.dtype).min, input)
            lifted = torch.where(torch.isnan(input), math.inf, lifted)
        _, indices = op(lifted, kernel_size, stride, padding, dilation, ceil_mode)
        planes = input.flatten(-dims)
        values = torch.gather(planes, -1, indices.flatten(-dims)).reshape(indices.shape)
        return values, indices

    return max_pool


max_pool2d_with_indices = _max_pool_with_indices(aten.max_pool2d_with_indices.default, 2)
max_pool3d_with_indices = _max_pool_with_indices(aten.max_pool3d_with_indices.default, 3)


def _per_dim(value, dims: int) -> list[int]:
    """A pooling argument given once or per dim, per dim."""
    values = [value] if isinstance(value, int) else list(value)
    return values * dims if len(values) == 1 else values


def _average_pool(op: torch._ops.OpOverload, dims: int):
    def pool(input, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        """Average pooling (a correction) of an unbatched input (channels and ``dims`` spatial
        dims) as a batch of one, and without padding on the part of the input its windows read:
        IREE 3.13's lowering takes batched inputs only ('linalg.pooling_nchw_sum' op expected
        operand #0 rank (3) to match ... (4)), and failed where windows leave the end of a dim
        unread (a 3x4x4 input in 2x2x2 windows: 'linalg.generic' op inferred input/output operand
        #1 has shape's dimension #0 to be 3, but found 2); both fell back."""
        arguments = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        if input.dim() == dims + 1:
            return pool(input.unsqueeze(0), *arguments).squeeze(0)
        kernel, steps, pads = (_per_dim(v, dims) for v in (kernel_size, stride or kernel_size, padding))
        if ceil_mode:
            return _ceil_mode_pool(input, dims, kernel, steps, pads, count_include_pad, divisor_override)
        if not any(pads):
            for d in range(dims):
                size = input.shape[d - dims]
                read = (size - kernel[d]) // steps[d] * steps[d] + kernel[d]
                if 0 < read < size:
                    input = input.narrow(d - dims, 0, read)
        return op(input, *arguments)

    return pool


def _ceil_mode_pool(input, dims, kernel, steps, pads, count_include_pad, divisor_override):
    """Average pooling whose last windows may reach past the padded input (``ceil_mode``), which
    IREE 3.13 failed to compile ('linalg.generic' op inferred input/output operand #2 has shape's
    dimension #2 to be 33, but found 32: Funnel's and EfficientNet's pools fell back): the sums
    of windows of the input padded with zeros far enough, divided by each window's count as
    torch counts it (within the padded input, or the input alone)."""
    spatial = list(input.shape[-dims:])
    outs = [pooling_output_shape(spatial[d], kernel[d], pads[d], steps[d], 1, True) for d in range(dims)]
    reach = [(outs[d] - 1) * steps[d] + kernel[d] for d in range(dims)]
    widths = []
    for d in reversed(range(dims)):  # F.pad lists the last dim first
        widths += [pads[d], max(reach[d] - spatial[d] - pads[d], 0)]
    padded = F.pad(input, widths)
    for d in range(dims):  # windows may end before the padding does (IREE refuses a negative pad)
        padded = padded.narrow(d - dims, 0, reach[d])
    summed = aten.avg_pool2d.default if dims == 2 else aten.avg_pool3d.default
    sums = summed(padded, kernel, steps, [0] * dims, False, True, 1)
    if divisor_override:
        return sums / divisor_override
    divisor = torch.ones(outs, dtype=torch.int64, device=input.device)
    for d in range(dims):
        counts = _window_counts(spatial[d], outs[d], kernel[d], steps[d], pads[d], count_include_pad)
        divisor = divisor * counts.to(input.device).reshape([-1] + [1] * (dims - 1 - d))
    return sums / divisor.to(sums.dtype)


avg_pool2d = _average_pool(aten.avg_pool2d.default, 2)
avg_pool3d = _average_pool(aten.avg_pool3d.default, 3)


def adaptive_windows(size: int, out: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per output position, the first input index of its window and the last one, and the
    widest window: torch's windows run from floor(i*size/out) to ceil((i+1)*size/out)."""
    position = torch.arange(out)
    start = torch.div(position * size, out, rounding_mode="floor")
    stop = torch.div((position + 1) * size + out - 1, out, rounding_mode="floor")
    widest = max(-(-(i + 1) * size // out) - (i * size // out) for i in range(out))
    return start, stop - 1, widest


def adaptive_max_pool(input: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive max pooling over the last len(output_size) dims, for any sizes.

    Each window is read at the widest window's length, the narrower ones repeating their last
    element (which changes neither the max nor where it first occurs). Indices count into the
    flattened spatial dims, as torch's do.
    """
    n = len(output_size)
    spatial = list(input.shape[-n:])
    batch = list(input.shape[:-n])
    windows = [adaptive_windows(size, out) for size, out in zip(spatial, output_size)]
    x = input
    for d, ((start, last, widest), out) in enumerate(zip(windows, output_size)):
        dim = len(batch) + 2 * d  # each earlier dim is now (out, widest)
        index = torch.minimum(start.unsqueeze(1) + torch.arange(widest).unsqueeze(0), last.unsqueeze(1))
        x = x.index_select(dim, index.reshape(-1))
        x = x.reshape(list(x.shape[:dim]) + [out, widest] + list(x.shape[dim + 1 :]))
    order = list(range(len(batch)))
    order += [len(batch) + 2 * d for d in range(n)] + [len(batch) + 2 * d + 1 for d in range(n)]
    x = x.permute(order).reshape(batch + list(output_size) + [-1])
    values, flat = torch.max(x, -1)
    indices = torch.zeros_like(flat)
    remaining = flat
    for d in reversed(range(n)):
        start, last, widest = windows[d]
        shape = [1] * len(batch) + [1] * n
        shape[len(batch) + d] = output_size[d]
        offset = torch.remainder(remaining, widest)
        remaining = torch.div(remaining, widest, rounding_mode="floor")
        position = torch.minimum(start.reshape(shape) + offset, last.reshape(shape))
        indices = indices + position * math.prod(spatial[d + 1 :])
    return values, indices


@registers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool_nd(input: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return adaptive_max_pool(input, list(output_size))


def _window_counts(size: int, out: int, kernel: int, stride: int, pad: int, include_pad: bool) -> torch.Tensor:
    """Per output position along one dim, how many places its window counts, as torch's kernels
    do: within the padded input where padding counts, within the input where it does not."""
    start = torch.arange(out) * stride - pad
    stop = (start + kernel).clamp(max=size + pad)
    if not include_pad:
        start, stop = start.clamp(min=0), stop.clamp(max=size)
    return stop - start


def _avg_pool_backward(dims: int):
    def avg_pool_backward(grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
        """Average pooling's gradient (torch has no decomposition, and IREE 3.13 cannot lower it): each
        output's gradient, divided by its window's count, spread over the window by a transposed
        convolution with a kernel of ones, then cropped to the input (ceil_mode's last windows may
        reach past it)."""
        spatial = list(input.shape[-dims:])
        expand = lambda value: [value] * dims if isinstance(value, int) else list(value) * (dims // len(value))  # noqa: E731
        kernel, pad = expand(kernel_size), expand(padding)
        step = expand(stride) if stride else kernel
        outs = list(grad_output.shape[-dims:])
        if divisor_override:
            scaled = grad_output / divisor_override
        else:
            divisor = torch.ones(outs, dtype=torch.int64, device=grad_output.device)
            for d in range(dims):
                counts = _window_counts(spatial[d], outs[d], kernel[d], step[d], pad[d], count_include_pad)
                divisor = divisor * counts.to(grad_output.device).reshape([-1] + [1] * (dims - 1 - d))
            scaled = grad_output / divisor.to(grad_output.dtype)
        flat = scaled.reshape([-1, 1] + outs)
        ones = torch.ones([1, 1] + kernel, dtype=grad_output.dtype, device=grad_output.device)
        spread = (F.conv_transpose2d if dims == 2 else F.conv_transpose3d)(flat, ones, stride=step)
        for d in range(dims):  # from padded coordinates to the input's, zeros where no window reached
            axis = 2 + d
            reach = spread.shape[axis]
            if reach < pad[d] + spatial[d]:
                widths = [0, 0] * (dims - 1 - d) + [0, pad[d] + spatial[d] - reach]
                spread = F.pad(spread, widths)
            spread = spread.narrow(axis, pad[d], spatial[d])
        return spread.reshape(input.shape)

    return avg_pool_backward


avg_pool2d_backward = registers(aten.avg_pool2d_backward.default)(_avg_pool_backward(2))
avg_pool3d_backward = registers(aten.avg_pool3d_backward.default)(_avg_pool_backward(3))


def _at_indices(grad_output: torch.Tensor, input: torch.Tensor, indices: torch.Tensor, dims: int) -> torch.Tensor:
    """Each output's gradient added at its index into its plane of the input (the gradient of any
    max pooling that returns indices)."""
    plane = math.prod(input.shape[-dims:])
    planes = grad_output.numel() // max(math.prod(grad_output.shape[-dims:]), 1)
    offsets = (torch.arange(planes, device=grad_output.device) * plane).reshape(-1, 1)
    flat = (indices.reshape(planes, -1) + offsets).reshape(-1)
    result = torch.zeros(planes * plane, dtype=grad_output.dtype, device=grad_output.device)
    return torch.index_put(result, (flat,), grad_output.reshape(-1), accumulate=True).reshape(input.shape)


def _adaptive_max_pool_backward(dims: int):
    def backward(grad_output, input, indices):
        """Adaptive max pooling's gradient, at the forward's indices (IREE 3.13 lowers none)."""
        return _at_indices(grad_output, input, indices, dims)

    return backward


def _fractional_starts(sample: torch.Tensor, size: int, out: int, pool: int) -> torch.Tensor:
    """torch's ``generate_intervals``: per plane's sample ([planes]), each output place's window
    start along one dim ([planes, out]), computed in the sample's precision as torch's kernel."""
    place = torch.arange(out, dtype=sample.dtype, device=sample.device)
    last = torch.full((out,), size - pool, dtype=torch.int64, device=sample.device)
    if out == 1:
        return last.expand(sample.shape[0], 1)
    alpha = torch.full((), size - pool, dtype=sample.dtype, device=sample.device) / (out - 1)
    s = sample.unsqueeze(1)
    starts = ((place + s) * alpha).to(torch.int64) - (s * alpha).to(torch.int64)
    return torch.where(place == out - 1, last, starts)


def _fractional_max_pool(dims: int):
    def forward(input, kernel_size, output_size, random_samples):
        """Fractional max pooling: windows of ``kernel_size`` at starts drawn from each plane's
        random samples (torch's intervals), read with a gather and maxed; indices count into
        each plane, as torch's (IREE 3.13 lowers none). torch's samples run W, H for 2-D and
        T, H, W for 3-D."""
        spatial = list(input.shape[-dims:])
        planes = math.prod(input.shape[:-dims])
        x = input.reshape(planes, -1)
        samples = random_samples.reshape(planes, dims)
        order = [1, 0] if dims == 2 else [0, 1, 2]  # the sample of each spatial dim
        flat = torch.zeros((planes,) + (1,) * (2 * dims), dtype=torch.int64, device=input.device)
        for d in range(dims):
            starts = _fractional_starts(samples[:, order[d]], spatial[d], output_size[d], kernel_size[d])
            shape = [planes] + [1] * (2 * dims)
            shape[1 + d] = output_size[d]
            offset = torch.arange(kernel_size[d], device=input.device).reshape([1] * (1 + dims + d) + [-1] + [1] * (dims - d - 1))
            flat = flat * spatial[d] + starts.reshape(shape) + offset
        flat = flat.reshape(planes, -1)  # [planes, outputs * window]
        window = math.prod(kernel_size[:dims])
        values = torch.gather(x, 1, flat).reshape(planes, -1, window)
        best, slot = torch.max(values, -1)
        indices = torch.gather(flat.reshape(planes, -1, window), 2, slot.unsqueeze(-1)).squeeze(-1)
        shape = list(input.shape[:-dims]) + list(output_size[:dims])
        return best.reshape(shape), indices.reshape(shape)

    return forward


def _fractional_max_pool_backward(dims: int):
    def backward(grad_output, input, kernel_size, output_size, indices):
        """Fractional max pooling's gradient, at the forward's indices (IREE 3.13 lowers none)."""
        return _at_indices(grad_output, input, indices, dims)

    return backward


@shape_rule("fractional_max_pool3d_backward")
def _fractional_max_pool3d_backward_shape(grad_output, input, *rest):
    """The gradient has the input's shape (torch has no shape rule for it; it has the 2-D one's)."""
    return input.new_empty(input.shape)


def _max_pool_backward(dims: int):
    def backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
        """Max pooling's gradient, at the forward's indices (IREE 3.13 does not compile
        max_pool3d's, nor max_pool2d's for some windows), gathered: each input place sums the
        gradients of the windows that cover it and picked it. A scatter to the indices (as for
        adaptive pooling) needed 2.3 MB of stack for a bfloat16 MNIST batch ('func.func' op
        exceeded stack allocation limit), and fell back."""
        spatial = [input.shape[d - dims] for d in range(dims)]
        kernel, steps, pads, dilations = (_per_dim(v, dims) for v in (kernel_size, stride or kernel_size, padding, dilation))
        wide = grad_output.to(torch.float32) if grad_output.dtype in (torch.bfloat16, torch.float16) else grad_output
        place = torch.zeros(spatial, dtype=torch.int64)
        for d in range(dims):
            place = place * spatial[d] + torch.arange(spatial[d]).reshape([-1] + [1] * (dims - d - 1))
        total = torch.zeros(input.shape, dtype=wide.dtype)
        for offsets in itertools.product(*(range(k) for k in kernel)):
            gradient, picked, covered = wide, indices, torch.ones(spatial, dtype=torch.bool)
            for d, offset in enumerate(offsets):
                start = torch.arange(spatial[d]) + pads[d] - offset * dilations[d]  # the window's start * stride
                window = torch.div(start, steps[d], rounding_mode="floor")
                valid = (start >= 0) & (torch.remainder(start, steps[d]) == 0) & (window < grad_output.shape[d - dims])
                window = torch.clamp(window, 0, grad_output.shape[d - dims] - 1)
                gradient = gradient.index_select(d - dims, window)
                picked = picked.index_select(d - dims, window)
                covered = covered & valid.reshape([-1] + [1] * (dims - d - 1))
            total = total + torch.where(covered & (picked == place), gradient, torch.zeros_like(gradient))
        return total.to(grad_output.dtype)

    return backward


for _dims in (2, 3):
    registers(getattr(aten, f"max_pool{_dims}d_with_indices_backward").default)(_max_pool_backward(_dims))
    registers(getattr(aten, f"adaptive_max_pool{_dims}d_backward").default)(_adaptive_max_pool_backward(_dims))
    registers(getattr(aten, f"fractional_max_pool{_dims}d").default)(_fractional_max_pool(_dims))
    registers(getattr(aten, f"fractional_max_pool{_dims}d_backward").default)(_fractional_max_pool_backward(_dims))
