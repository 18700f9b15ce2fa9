"""turbine's own decompositions (eager/decompositions.py) and the torch ones it adds
(eager/lowering.py): each op runs as an IREE kernel, with no fallback, and matches torch on
the CPU, special values included."""

import math
import os

import pytest
import torch

import turbine

D = os.environ.get("TURBINE_TEST_DEVICE", "turbine:cpu")

# IREE's CPU code flushes subnormal floats to zero, so the special values stay normal.
SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-30, -3e-32, 1.0, -1.0, 2.0, 0.5]


def _inputs(*shape, low=-4.0, high=4.0):
    x = torch.empty(*shape).uniform_(low, high)
    x.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
    return x


def check_on_iree(fn, *inputs, **tolerance):
    """fn on turbine matches torch, and no op of it fell back."""
    with turbine.fallback("error"):
        actual = fn(*[t.to(D) for t in inputs])
    expected = fn(*inputs)
    actual = [a.cpu() for a in actual] if isinstance(actual, tuple) else actual.cpu()
    expected = list(expected) if isinstance(expected, tuple) else expected
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance)


@pytest.mark.parametrize(
    "fn",
    [torch.signbit, torch.frexp, torch.angle, lambda t: torch.log10(t.abs()), lambda t: torch.copysign(t, -0.0)],
    ids=["signbit", "frexp", "angle", "log10", "copysign_scalar"],
)
def test_unary_bit_and_sign_ops(fn):
    check_on_iree(fn, _inputs(7, 9))


@pytest.mark.parametrize(
    "fn",
    [torch.copysign, torch.hypot, torch.fmax, torch.fmin, torch.nextafter],
    ids=["copysign", "hypot", "fmax", "fmin", "nextafter"],
)
def test_binary_sign_and_magnitude_ops(fn):
    x, y = _inputs(7, 9), _inputs(7, 9).flip(1)
    check_on_iree(fn, x, y)
    check_on_iree(fn, x, y[0, 3].clone())  # a 0-d second operand


def test_hypot_is_inf_when_either_side_is_inf_even_with_nan():
    check_on_iree(torch.hypot, torch.tensor([math.inf, math.nan, 3e30]), torch.tensor([math.nan, -math.inf, 4e30]))


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: torch.nn.functional.max_pool2d(t, 3, stride=2, padding=1, return_indices=True),
        lambda t: torch.nn.functional.adaptive_max_pool2d(t, (3, 5), return_indices=True),
        lambda t: torch.nn.functional.adaptive_max_pool3d(t, (2, 3, 5), return_indices=True),
        lambda t: torch.nn.functional.interpolate(t, scale_factor=2, mode="bilinear"),
        lambda t: torch.nn.functional.interpolate(t, size=(5, 9), mode="bicubic", align_corners=True),
        lambda t: torch.addmv(t[0, 0, :, 0], t[0, 0], t[1, 1, 0]),
        lambda t: torch.dist(t[0], t[1], 3),
        lambda t: t.permute(3, 1, 0, 2).contiguous(),
    ],
    ids=["max_pool2d", "adaptive_max_pool2d", "adaptive_max_pool3d", "bilinear", "bicubic", "addmv", "dist", "permute_copy"],
)
def test_ops_from_torchs_wider_decomposition_table(fn):
    check_on_iree(fn, torch.randn(2, 3, 8, 8))


def test_grid_sample():
    grid = torch.rand(2, 5, 4, 2) * 2.2 - 1.1
    check_on_iree(lambda t, g: torch.nn.functional.grid_sample(t, g, align_corners=False), torch.randn(2, 3, 6, 7), grid)
