"""2-D convolution and its gradients as the matmuls and stride-1 convolutions IREE runs fast.

Measured on turbine:cpu against torch's CPU kernel (one thread each, IREE 3.13): IREE's own
kernels ran a stride-1 forward convolution at 0.9-1.8x torch's time, but a strided one at
8-14x, the input gradient at 26-128x and the weight gradient at 23-25x (MNIST's second layer:
551 ms against 13 for its input gradient). Written as below they ran at 0.6-3x:

- forward, stride 1: IREE's convolution, its output widened to a multiple of 8 and cropped
  (IREE's kernel ran 2.4-4x slower per element at other widths);
- forward, strided: im2col (a gather IREE fuses) and one batched matmul;
- weight gradient: im2col of the input and a batched matmul with the output gradient;
- input gradient, stride 1: a stride-1 convolution of the padded output gradient with the
  flipped, transposed weights;
- input gradient, strided: one matmul with the transposed weights, whose taps are placed back
  (spaced by the stride) and summed;
- bias gradient: a sum.

A transposed convolution's gradients are those of the plain convolution it transposes (IREE 3.13
could not compile them when strided or dilated, so decoders, GANs, U-Nets and vocoders trained
with the fallback): its input gradient is that convolution run forward on the output gradient,
its weight gradient that convolution's weight gradient with the roles of input and output
swapped (im2col in 2-D, IREE's own lowering in 1-D and 3-D, which it compiles for plain ones).

Grouped, 1-D and 3-D convolutions, and dilated input gradients, keep IREE's lowering, except
those whose output is one wide along a dim: they run on the part of the input they read, and 3-D
depthwise ones, which IREE 3.13 could not legalize: they run with a zero filter beside each
channel's (see :func:`_doubled`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _per_dim(weight: torch.Tensor, *lists: list[int]) -> list[list[int]]:
    """Each of ``lists`` (stride, padding, ...) with one value per spatial dim: torch passes a
    one-element list for all of them (``conv2d(padding="valid")`` passes ``[0]``)."""
    dims = weight.dim() - 2
    return [list(values) * dims if len(values) == 1 else list(values) for values in lists]


def _plain_2d(weight: torch.Tensor, transposed: bool, groups: int) -> bool:
    return weight.dim() == 4 and not transposed and groups == 1


def _columns(x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int]) -> torch.Tensor:
    """im2col: [N, C*kh*kw, OH*OW], the input values each output position's kernel reads (torch's
    decomposition of it: a gather, which IREE fuses into its consumer)."""
    return torch._decomp.decomposition_table[aten.im2col.default](x, kernel, dilation, padding, stride)


def convolution(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> torch.Tensor:
    """``aten.convolution``: strided 2-D ones as im2col and a matmul, the rest as they are (one
    whose output is one wide along a dim on the part of the input it reads)."""
    stride, padding, dilation, output_padding = _per_dim(weight, stride, padding, dilation, output_padding)
    if not transposed and not _plain_2d(weight, transposed, groups):
        window = _read_window(input, weight, stride, padding, dilation)
        if window is not None:
            return _convolve(window, weight, bias, stride, [0] * len(padding), dilation, False, output_padding, groups)
    if not _plain_2d(weight, transposed, groups):
        return _convolve(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if list(stride) == [1, 1]:
        return _stride_1(input, weight, bias, padding, dilation)
    n, out_channels = input.shape[0], weight.shape[0]
    kernel = list(weight.shape[2:])
    size = [
        (input.shape[2 + d] + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) // stride[d] + 1 for d in range(2)
    ]
    out = torch.matmul(weight.reshape(out_channels, -1), _columns(input, kernel, stride, padding, dilation))
    out = out.reshape(n, out_channels, *size)
    return out if bias is None else out + bias.reshape(1, -1, 1, 1)


#: IREE 3.13's CPU convolution ran 2.4-4x slower per output element when the output's width was
#: not a multiple of this (64->32 channels, 3x3: width 24 15 ms, 26 61 ms, 32 26 ms).
_WIDTH_MULTIPLE = 8


def _stride_1(input, weight, bias, padding, dilation) -> torch.Tensor:
    """A stride-1 2-D convolution, run on an input padded on the right so that the output's
    width is a multiple of _WIDTH_MULTIPLE, then cropped back."""
    width = input.shape[3] + 2 * padding[1] - dilation[1] * (weight.shape[3] - 1)
    extra = -width % _WIDTH_MULTIPLE
    if not extra:
        return aten.convolution.default(input, weight, bias, [1, 1], padding, dilation, False, [0, 0], 1)
    padded = F.pad(input, (padding[1], padding[1] + extra, padding[0], padding[0]))
    out = aten.convolution.default(padded, weight, bias, [1, 1], [0, 0], dilation, False, [0, 0], 1)
    return out[:, :, :, :width]


def convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: list[int] | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``aten.convolution_backward`` for plain 2-D convolutions and transposed ones (see the module docstring)."""
    stride, padding, dilation, output_padding = _per_dim(weight, stride, padding, dilation, output_padding)
    if transposed:
        return _transposed_backward(grad_output, input, weight, stride, padding, dilation, groups, output_mask)
    if not _plain_2d(weight, transposed, groups) and _read_window(input, weight, stride, padding, dilation) is not None:
        return _windowed_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, output_padding, groups, output_mask)
    if not _plain_2d(weight, transposed, groups):
        return _convolve_backward(
            grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
        )
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if list(dilation) != [1, 1]:
            grad_input = aten.convolution_backward.default(
                grad_output, input, weight, bias_sizes, stride, padding, dilation, False, output_padding, 1, [True, False, False]
            )[0]
        elif list(stride) == [1, 1]:
            grad_input = _input_gradient_stride_1(grad_output, input, weight, padding)
        else:
            grad_input = _input_gradient_strided(grad_output, input, weight, stride, padding)
    if output_mask[1]:
        grad_weight = _weight_gradient(grad_output, input, weight, stride, padding, dilation)
    if output_mask[2]:
        grad_bias = grad_output.sum([0, 2, 3])
    return grad_input, grad_weight, grad_bias


def _depthwise_3d(weight: torch.Tensor, transposed: bool, groups: int) -> bool:
    """A 3-D convolution with one input and one output channel a group."""
    return weight.dim() == 5 and not transposed and groups > 1 and weight.shape[0] == groups and weight.shape[1] == 1


def _doubled(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """``tensor`` with zeros after each of its entries along ``dim`` (twice as long there): a
    depthwise weight [C, 1, k...] along 0 becomes [2C, 1, k...], each channel's filter followed by
    a zero one. IREE 3.13 could not legalize a 3-D depthwise convolution ('torch.aten.convolution'
    explicitly marked illegal) but compiles one with two output channels a group; the even ones
    are the depthwise convolution's, at twice its arithmetic."""
    return torch.stack([tensor, torch.zeros_like(tensor)], dim + 1).flatten(dim, dim + 1)


def _convolve(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups) -> torch.Tensor:
    """``aten.convolution`` as IREE compiles it: a 3-D depthwise one with :func:`_doubled` weights."""
    if not _depthwise_3d(weight, transposed, groups):
        return aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    out = aten.convolution.default(input, _doubled(weight, 0), None, stride, padding, dilation, False, output_padding, groups)[:, 0::2]
    return out if bias is None else out + bias.reshape(1, -1, 1, 1, 1)


def _convolve_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask) -> tuple:
    """``aten.convolution_backward`` as IREE compiles it: a 3-D depthwise one as the gradients of
    :func:`_convolve`'s (the zero channels' output gradient zero, their weight gradient dropped)."""
    if not _depthwise_3d(weight, transposed, groups):
        return aten.convolution_backward.default(
            grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
        )
    mask = [output_mask[0], output_mask[1], False]
    grad_input, grad_weight, _ = aten.convolution_backward.default(
        _doubled(grad_output, 1), input, _doubled(weight, 0), None, stride, padding, dilation, False, output_padding, groups, mask
    )
    if grad_weight is not None:
        grad_weight = grad_weight[0::2]
    grad_bias = grad_output.sum([0, 2, 3, 4]) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


def _read_window(input, weight, stride, padding, dilation) -> torch.Tensor | None:
    """The padded input cut to the part the convolution reads, where its output is one wide along
    some dim and the padded input is wider there than the kernel's reach; else None. IREE 3.13
    could not compile a convolution of that shape ('linalg.generic' op inferred input/output
    operand #1 has shape's dimension #1 to be 4, but found 3: MobileViT's depthwise 3x3, stride
    2, on a 2x2 map; 1-D and 3-D ones alike); cut to the kernel's reach, it compiles. (Plain 2-D
    convolutions are matmuls here, which never met it.)"""
    dims = weight.dim() - 2
    reach = [dilation[d] * (weight.shape[2 + d] - 1) + 1 for d in range(dims)]
    padded = [input.shape[2 + d] + 2 * padding[d] for d in range(dims)]
    single = [(padded[d] - reach[d]) // stride[d] + 1 == 1 and padded[d] > reach[d] for d in range(dims)]
    if not any(single):
        return None
    window = F.pad(input, [p for d in reversed(range(dims)) for p in (padding[d], padding[d])])
    for d in range(dims):
        if single[d]:
            window = window.narrow(2 + d, 0, reach[d])
    return window


def _windowed_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, output_padding, groups, output_mask) -> tuple:
    """The gradients of a convolution run on its read window (:func:`_read_window`): the window's
    input gradient placed back in the padded input's shape (zero outside what was read) and
    cropped to the input."""
    window = _read_window(input, weight, stride, padding, dilation)
    zeros = [0] * len(padding)
    grad_window, grad_weight, grad_bias = _convolve_backward(
        grad_output, window, weight, bias_sizes, stride, zeros, dilation, False, output_padding, groups, output_mask
    )
    grad_input = None
    if output_mask[0]:
        dims = len(padding)
        widths = [input.shape[2 + d] + 2 * padding[d] - window.shape[2 + d] for d in range(dims)]
        grad_input = F.pad(grad_window, [p for d in reversed(range(dims)) for p in (0, widths[d])])
        for d in range(dims):
            grad_input = grad_input.narrow(2 + d, padding[d], input.shape[2 + d])
    return grad_input, grad_weight, grad_bias


def _transposed_backward(grad_output, input, weight, stride, padding, dilation, groups, output_mask) -> tuple:
    """The gradients of a transposed convolution (1-D, 2-D or 3-D). Its weight [C_in,
    C_out/groups, *kernel] is the transposed convolution's own and the plain one's alike."""
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        zeros = [0] * (weight.dim() - 2)
        grad_input = convolution(grad_output, weight, None, stride, padding, dilation, False, zeros, groups)
    if output_mask[1] and weight.dim() == 4:
        grad_weight = _grouped_weight_gradient(input, grad_output, weight, stride, padding, dilation, groups)
    elif output_mask[1]:  # IREE's own weight gradient of the plain convolution, which it compiles
        zeros = [0] * (weight.dim() - 2)
        grad_weight = aten.convolution_backward.default(
            input, grad_output, weight, None, stride, padding, dilation, False, zeros, groups, [False, True, False]
        )[1]
    if output_mask[2]:
        grad_bias = grad_output.sum([0] + list(range(2, grad_output.dim())))
    return grad_input, grad_weight, grad_bias


def _grouped_weight_gradient(input, grad_output, weight, stride, padding, dilation, groups) -> torch.Tensor:
    """A 2-D transposed convolution's weight gradient [C_in, C_out/groups, kh, kw]: each group's
    input channels against the im2col columns of its output channels' gradient, summed over the
    batch, all groups in one batched matmul (as chunks and a concatenation, IREE's CUDA kernel
    gave a wrong gradient for a grouped, dilated one)."""
    n, in_channels = input.shape[:2]
    columns = _columns(grad_output, list(weight.shape[2:]), stride, padding, dilation)  # N, C_out*kh*kw, L
    length = columns.shape[2]
    columns = columns.reshape(n, groups, -1, length).permute(1, 0, 3, 2).reshape(groups, n * length, -1)
    inputs = input.reshape(n, groups, in_channels // groups, length).permute(1, 2, 0, 3).reshape(groups, in_channels // groups, n * length)
    return torch.bmm(inputs, columns).reshape(weight.shape)


def _weight_gradient(grad_output, input, weight, stride, padding, dilation) -> torch.Tensor:
    n, out_channels = grad_output.shape[:2]
    columns = _columns(input, list(weight.shape[2:]), stride, padding, dilation)  # N, C*kh*kw, L
    per_sample = torch.bmm(grad_output.reshape(n, out_channels, -1), columns.transpose(1, 2))
    return per_sample.sum(0).reshape(weight.shape)


def _input_gradient_stride_1(grad_output, input, weight, padding) -> torch.Tensor:
    """The input gradient of a stride-1 convolution: a stride-1 convolution itself, of the output
    gradient padded by kernel - 1 with the kernel flipped and its channels swapped, less the
    forward padding (cropped, or padded by less where the kernel is wider than the padding)."""
    kh, kw = weight.shape[2:]
    ph, pw = kh - 1 - padding[0], kw - 1 - padding[1]
    flipped = weight.flip(2, 3).transpose(0, 1)
    padded = F.pad(grad_output, (max(pw, 0), max(pw, 0), max(ph, 0), max(ph, 0)))
    result = _stride_1(padded, flipped, None, [0, 0], [1, 1])
    top, left = max(-ph, 0), max(-pw, 0)
    return result[:, :, top : top + input.shape[2], left : left + input.shape[3]]


def _input_gradient_strided(grad_output, input, weight, stride, padding) -> torch.Tensor:
    """The input gradient of a strided convolution: each kernel tap's share (one matmul for all
    taps), spaced out by the stride, shifted to the tap's offset and summed, then cropped."""
    n, channels, height, width = input.shape
    out_channels, _, kh, kw = weight.shape
    oh, ow = grad_output.shape[2:]
    sh, sw = stride
    taps = torch.matmul(weight.permute(2, 3, 1, 0).reshape(kh * kw * channels, out_channels), grad_output.reshape(n, out_channels, oh * ow))
    taps = taps.reshape(n, kh, kw, channels, oh, ow)
    spread = F.pad(taps.reshape(n, kh, kw, channels, oh, 1, ow, 1), (0, sw - 1, 0, 0, 0, sh - 1))
    spread = spread.reshape(n, kh, kw, channels, oh * sh, ow * sw)
    full_h, full_w = height + 2 * padding[0], width + 2 * padding[1]
    total = None
    for i in range(kh):
        for j in range(kw):
            tap = spread[:, i, j, :, : full_h - i, : full_w - j]
            tap = F.pad(tap, (j, full_w - j - tap.shape[3], i, full_h - i - tap.shape[2]))
            total = tap if total is None else total + tap
    return total[:, :, padding[0] : padding[0] + height, padding[1] : padding[1] + width]
