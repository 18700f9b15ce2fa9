"""2-D convolutions and their gradients (eager/decompositions/convolution.py) match torch on the
CPU and run on IREE kernels, for strides, paddings, dilations and widths that take each path."""

from __future__ import annotations


import pytest
import torch

import turbine
from checks import D

aten = torch.ops.aten

CASES = {
    # name: (input shape, weight shape, stride, padding, dilation, groups)
    "3x3 stride 1, odd width": ((2, 3, 9, 11), (4, 3, 3, 3), 1, 1, 1, 1),
    "3x3 stride 1, no padding": ((2, 3, 10, 26), (5, 3, 3, 3), 1, 0, 1, 1),
    "3x3 stride 2": ((2, 3, 11, 10), (4, 3, 3, 3), 2, 1, 1, 1),
    "1x1 stride 2": ((2, 4, 8, 8), (6, 4, 1, 1), 2, 0, 1, 1),
    "7x7 stride 2, padding 3": ((1, 3, 16, 15), (4, 3, 7, 7), 2, 3, 1, 1),
    "patch 4x4 stride 4": ((2, 3, 16, 16), (8, 3, 4, 4), 4, 0, 1, 1),
    "non-square kernel and stride": ((2, 2, 9, 12), (3, 2, 2, 3), (2, 1), (0, 1), 1, 1),
    "dilated": ((1, 2, 12, 12), (3, 2, 3, 3), 1, 2, 2, 1),
    "padding wider than the kernel": ((1, 2, 6, 6), (2, 2, 3, 3), 1, 3, 1, 1),
    "grouped (IREE's own lowering)": ((2, 4, 8, 8), (6, 2, 3, 3), 1, 1, 1, 2),
    # torch passes aten a one-element padding list for these (they fell back: an IndexError)
    "padding valid": ((2, 3, 9, 11), (4, 3, 3, 3), 1, "valid", 1, 1),
    "padding same, dilated": ((2, 3, 9, 11), (4, 3, 3, 3), 1, "same", 2, 1),
    "padding same, even kernel": ((1, 2, 8, 9), (3, 2, 2, 4), 1, "same", 1, 1),
}


def _pair(value):
    return list(value) if isinstance(value, tuple) else value if isinstance(value, str) else [value, value]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_convolution_and_gradients_match_torch(case, bias, stats):
    input_shape, weight_shape, stride, padding, dilation, groups = CASES[case]
    x = torch.randn(input_shape, requires_grad=True)
    w = torch.randn(weight_shape, requires_grad=True)
    b = torch.randn(weight_shape[0], requires_grad=True) if bias else None
    options = {"stride": _pair(stride), "padding": _pair(padding), "dilation": _pair(dilation), "groups": groups}
    expected = torch.nn.functional.conv2d(x, w, b, **options)
    upstream = torch.randn(expected.shape)
    expected_grads = torch.autograd.grad(expected, [x, w] + ([b] if bias else []), upstream)
    device_inputs = [t.detach().to(D).requires_grad_() for t in [x, w] + ([b] if bias else [])]
    with turbine.fallback("error"):
        actual = torch.nn.functional.conv2d(device_inputs[0], device_inputs[1], device_inputs[2] if bias else None, **options)
        actual_grads = torch.autograd.grad(actual, device_inputs, upstream.to(D))
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-4)
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    assert stats()["fallbacks"] == {}


def test_one_value_for_every_dim_runs_on_iree(stats):
    """aten.convolution and its gradient take stride, padding and dilation lists of one element
    meaning every spatial dim (what ``conv2d(padding="valid")`` passes)."""
    x, w = torch.randn(2, 3, 10, 9), torch.randn(4, 3, 3, 3)
    g = torch.randn(2, 4, 8, 7)
    lists = ([1], [0], [1], False, [0], 1)  # torch's CPU kernel refuses [2] as every dim's stride
    expected = aten.convolution.default(x, w, None, *lists)
    expected_grads = aten.convolution_backward.default(g, x, w, [4], *lists, [True, True, True])
    with turbine.fallback("error"):
        actual = aten.convolution.default(x.to(D), w.to(D), None, *lists)
        actual_grads = aten.convolution_backward.default(g.to(D), x.to(D), w.to(D), [4], *lists, [True, True, True])
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-4)
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    assert stats()["fallbacks"] == {}


TRANSPOSED = {
    # name: (input shape, weight shape [C_in, C_out/groups, kh, kw], options)
    "stride 1": ((2, 4, 7, 8), (4, 3, 3, 3), {}),
    "stride 2, output padding": ((2, 4, 7, 8), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    "non-square stride, dilated": ((1, 4, 6, 5), (4, 2, 3, 2), dict(stride=(2, 3), padding=(1, 0), dilation=(1, 2))),
    "grouped, dilated": ((2, 4, 5, 6), (4, 3, 3, 3), dict(groups=2, dilation=2)),
    "1-D, stride 2": ((2, 4, 9), (4, 3, 5), dict(stride=2, padding=1)),
    "3-D, stride 2": ((1, 2, 4, 5, 4), (2, 3, 3, 3, 3), dict(stride=2)),
}


@pytest.mark.parametrize("case", sorted(TRANSPOSED))
def test_transposed_convolution_gradients_match_torch(case, stats):
    """Transposed convolutions' gradients, as the plain convolution's they transpose: IREE 3.13
    could not compile strided or dilated ones, so decoders, GANs, U-Nets and vocoders trained
    with the fallback."""
    input_shape, weight_shape, options = TRANSPOSED[case]
    leaves = [torch.randn(input_shape), torch.randn(weight_shape), torch.randn(weight_shape[1] * options.get("groups", 1))]
    leaves = [t.requires_grad_() for t in leaves]
    transposed = [None, None, None, torch.nn.functional.conv_transpose1d, torch.nn.functional.conv_transpose2d, torch.nn.functional.conv_transpose3d][len(input_shape)]
    _matches_torch_on_iree(transposed, leaves, options, stats)


def _matches_torch_on_iree(convolution, leaves, options, stats) -> None:
    """``convolution`` and its gradients on turbine match torch's on the CPU, on IREE kernels alone."""
    expected = convolution(*leaves, **options)
    upstream = torch.randn(expected.shape)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    device_leaves = [t.detach().to(D).requires_grad_() for t in leaves]
    with turbine.fallback("error"):
        actual = convolution(*device_leaves, **options)
        actual_grads = torch.autograd.grad(actual, device_leaves, upstream.to(D))
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-4)
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    assert stats()["fallbacks"] == {}


def test_convolution_backward_returns_only_the_gradients_asked_for():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    go = torch.randn(2, 4, 8, 8)
    for mask in ([True, False, False], [False, True, False], [False, False, True]):
        expected = aten.convolution_backward(go, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)
        actual = aten.convolution_backward(go.to(D), x.to(D), w.to(D), [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)
        for asked, got, want in zip(mask, actual, expected):
            if asked:  # (torch's CPU kernel also returns the weight's when only the bias's is asked for)
                torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
            else:
                assert got is None


ONE_WIDE = {
    # name: (input shape, weight shape, options): outputs one wide along a dim, the padded input
    # wider there than the kernel's reach
    "depthwise 3x3 stride 2 on 2x2 (MobileViT)": ((2, 8, 2, 2), (8, 1, 3, 3), dict(stride=2, padding=1, groups=8)),
    "depthwise 3x3 stride 4, no padding, one dim": ((2, 4, 5, 9), (4, 1, 3, 3), dict(stride=(4, 1), groups=4)),
    "1-D": ((2, 6, 2), (6, 1, 3), dict(stride=2, padding=1, groups=6)),
    "3-D": ((1, 4, 2, 2, 2), (4, 4, 3, 3, 3), dict(stride=2, padding=1)),
    "3-D depthwise": ((2, 4, 2, 5, 6), (4, 1, 3, 3, 3), dict(stride=2, padding=1, groups=4)),
}


@pytest.mark.parametrize("case", sorted(ONE_WIDE))
def test_convolutions_one_wide_run_on_the_part_they_read(case, stats):
    """IREE 3.13 could not compile a convolution (other than a plain 2-D one, a matmul here)
    whose output is one wide along a dim where the padded input is wider than the kernel's
    reach: MobileViT's depthwise layers fell back. It runs on the part of the input it reads."""
    input_shape, weight_shape, options = ONE_WIDE[case]
    leaves = [torch.randn(input_shape), torch.randn(weight_shape), torch.randn(weight_shape[0])]
    leaves = [t.requires_grad_() for t in leaves]
    convolution = [None, None, None, torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d][len(input_shape)]
    _matches_torch_on_iree(convolution, leaves, options, stats)


DEPTHWISE_3D = {
    "3x3x3, padded": ((2, 8, 5, 6, 7), (8, 1, 3, 3, 3), dict(padding=1, groups=8)),
    "3x3x3, stride 2, dilated": ((2, 8, 5, 6, 7), (8, 1, 3, 3, 3), dict(stride=2, padding=2, dilation=2, groups=8)),
    "1x3x5, stride (1, 2, 1)": ((1, 6, 4, 7, 9), (6, 1, 1, 3, 5), dict(stride=(1, 2, 1), padding=(0, 1, 2), groups=6)),
}


@pytest.mark.parametrize("case", sorted(DEPTHWISE_3D))
def test_depthwise_3d_convolutions_and_their_gradients(case, stats):
    """IREE 3.13 could not legalize a 3-D convolution with one input and one output channel a
    group (video models' depthwise layers fell back); it runs with a zero filter beside each."""
    input_shape, weight_shape, options = DEPTHWISE_3D[case]
    leaves = [torch.randn(input_shape), torch.randn(weight_shape), torch.randn(weight_shape[0])]
    _matches_torch_on_iree(torch.nn.functional.conv3d, [t.requires_grad_() for t in leaves], options, stats)
