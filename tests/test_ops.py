"""Ops run as IREE kernels and match torch on the CPU."""

from typing import Callable

import pytest
import torch

from checks import D, check



UNARY = {
    "relu": torch.relu, "exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "neg": torch.neg,
    "abs": torch.abs, "sin": torch.sin, "gelu": torch.nn.functional.gelu, "softmax": lambda x: x.softmax(-1),
    "log_softmax": lambda x: x.log_softmax(1), "sum": torch.sum, "mean_dim": lambda x: x.mean(0, keepdim=True),
    "amax": lambda x: x.amax(1), "cumsum": lambda x: x.cumsum(1), "transpose_mm": lambda x: x.t() @ x,
    "clamp": lambda x: x.clamp(-0.5, 0.5), "where": lambda x: torch.where(x > 0, x, 0.0),
    "pow": lambda x: x.abs() ** 1.5, "argmax": lambda x: x.argmax(1), "norm": torch.linalg.vector_norm,
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)),
    "index": lambda x: x[torch.tensor([2, 0])], "gt_scalar": lambda x: x > 0.25, "flip": lambda x: x.flip(0),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_and_reduction_ops(name):
    check(UNARY[name], torch.randn(6, 5), atol=1e-4, rtol=1e-4)


def test_binary_ops_with_broadcasting_and_scalars():
    a, b = torch.randn(4, 5), torch.randn(5)
    check(lambda x, y: x + y, a, b)
    check(lambda x, y: x * y - 2 * x / (y.abs() + 1), a, b)
    check(lambda x, y: torch.maximum(x, y), a, b)
    check(lambda x: 3.0 - x, a)
    check(lambda x: 1 / (x.abs() + 1), a)
    check(lambda x: x + torch.tensor(2.5), a)  # a 0-d CPU tensor is a scalar


def test_matmul_family():
    check(torch.mm, torch.randn(8, 16), torch.randn(16, 4), atol=1e-4, rtol=1e-4)
    check(torch.bmm, torch.randn(3, 8, 16), torch.randn(3, 16, 4), atol=1e-4, rtol=1e-4)
    check(lambda x, w, b: torch.nn.functional.linear(x, w, b), torch.randn(5, 7), torch.randn(3, 7), torch.randn(3),
          atol=1e-4, rtol=1e-4)
    check(lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3),
          atol=1e-4, rtol=1e-4)


def test_ops_with_several_outputs():
    x = torch.randn(6, 7)
    check(lambda t: torch.max(t, dim=1), x)
    check(lambda t: torch.min(t, dim=0, keepdim=True), x)
    check(lambda t: torch.topk(t, 3), x)
    check(lambda t: torch.sort(t, dim=1, descending=True), x)
    check(lambda t: torch.var_mean(t, dim=1), x)
    check(lambda t: torch.std_mean(t, dim=0, correction=0), x)
    check(lambda t: torch.aminmax(t, dim=1), x)


def test_tensor_lists_and_keyword_arguments():
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    check(lambda x, y: torch.cat([x, y, x], dim=1), a, b)
    check(lambda x, y: torch.stack([x, y]), a, b)
    check(lambda x: torch.sum(x, dim=1, keepdim=True, dtype=torch.float64), a)
    check(lambda x: x.to(torch.int32), a * 10)
    check(lambda x, y: torch.add(x, y, alpha=0.5), a, b)


@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8],
    ids=str,
)
def test_dtypes_and_promotion(dtype):
    x = (torch.randn(4, 4) * 10).to(dtype)
    y = (torch.randn(4, 4) * 10).to(torch.int64)
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype in (torch.float16, torch.bfloat16) else {}
    check(lambda a: a * 2, x, **tol)
    check(lambda a: a * 0.5, x, **tol)
    check(lambda a, b: a + b, x, y, **tol)
    check(lambda a: a.sum(), x, **tol)
    check(lambda a: a > 1, x)


def test_float64_is_computed_in_float64():
    x = torch.randn(16, dtype=torch.float64)
    actual = (x.to(D) * (1 + 1e-12)).cpu()
    torch.testing.assert_close(actual, x * (1 + 1e-12), rtol=0, atol=0)


def test_bool_ops():
    a, b = torch.rand(5) > 0.5, torch.rand(5) > 0.5
    check(lambda x, y: x & y, a, b)
    check(lambda x: ~x, a)
    check(lambda x: x.any(), a)


def test_pow_of_negative_bases():
    x = torch.randn(4, 5)
    check(lambda t: t ** 2, x)
    check(lambda t: t ** 3.0, x)
    check(lambda t: t.square(), x)
    check(lambda t, e: t ** e, x, torch.randint(-2, 4, (4, 5)).float())
    check(lambda t, e: torch.pow(t, e), x, torch.randn(4, 5), equal_nan=True)


def test_scalar_sign_of_zero_and_nan_are_kept():
    x = torch.randn(5).abs() + 0.5
    check(lambda t: 1 / (t * 0.0), x)
    check(lambda t: 1 / (t * -0.0), x)
    check(lambda t: t * float("nan"), x, equal_nan=True)
    check(lambda t: t + float("inf"), x)


ZERO_SIZE = {  # name: (function, input shape, executor)
    "add": (lambda x: x + 1, (0, 3), "iree"),
    "sum over the empty dim": (lambda x: x.sum(0), (0, 3), "host"),
    "sum of an empty row": (lambda x: x.sum(1), (3, 0), "host"),
    "mean of nothing": (lambda x: x.mean(), (0,), "host"),
    "std over the empty dim": (lambda x: x.std(0), (0, 3), "host"),
    "product of nothing": (lambda x: x.prod(1), (2, 0), "host"),
    "matmul over an empty inner dim": (lambda x: x @ x.t(), (3, 0), "host"),
    "scatter_add of an empty index": (lambda x: torch.zeros(5, device=x.device).scatter_add(0, x.long(), x), (0,), "iree"),
    "scatter_add of an empty index of another dtype, torch's error": (
        lambda x: _raised(lambda: torch.zeros(3, device=x.device).scatter_add(0, x.long(), x.double())), (0,), "iree"
    ),
    "index_put of an all-false mask": (lambda x: torch.index_put(x, (x < -100,), torch.ones((), device=x.device)), (4,), "iree"),
    "gradient of gather by an empty index": (lambda x: _gather_gradient(x, torch.zeros(0, dtype=torch.long)), (5,), "host"),  # the sum of the empty gather
    "max of nothing, torch's error": (lambda x: _raised(lambda: x.max()), (0,), "host"),
    "cat with an empty part": (lambda x: torch.cat([x, torch.ones(2, 3, device=x.device)]), (0, 3), "iree"),
    "empty slice of a view": (lambda x: x.t()[1:1] * 2, (3, 4), "iree"),
    "zeros factory": (lambda x: torch.zeros(0, 2, device=x.device) + x.sum(), (2, 2), "iree"),
}


def _gather_gradient(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x's gradient through a gather by ``index`` (on x's device): a scatter_add into zeros."""
    leaf = x.detach().requires_grad_()
    leaf.gather(0, index.to(x.device)).sum().backward()
    return leaf.grad


def _raised(fn: Callable) -> str:
    """The error ``fn`` raises, in words (torch's and turbine's must agree)."""
    with pytest.raises(Exception) as raised:
        fn()
    return f"{type(raised.value).__name__}: {raised.value}"


@pytest.mark.parametrize("name", sorted(ZERO_SIZE))
def test_tensors_with_no_elements(name):
    """IREE's compiler can crash on zero-size tensors, so these must never reach it and still give
    torch's results: a call whose results are empty runs no kernel; one that reads only empty
    tensors takes torch's results from their shapes (the sum of nothing is 0, its mean NaN) on
    the host; a scatter of an empty index is its first argument. None falls back."""
    fn, shape, executor = ZERO_SIZE[name]
    check(fn, torch.randn(shape), executor=executor, equal_nan=True)
