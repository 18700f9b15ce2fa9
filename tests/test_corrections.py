"""Ops IREE 3.13 gets wrong or cannot take as they are, which turbine corrects (eager/lowering.py,
dispatch.py): each compared with torch on the CPU. All were found by the OpInfo run."""

import os

import pytest
import torch

D = os.environ.get("TURBINE_TEST_DEVICE", "turbine:cpu")  # the GPU run sets turbine:cuda0


def check(fn, *inputs, **tolerance):
    expected = fn(*inputs)
    actual = fn(*[t.to(D) if isinstance(t, torch.Tensor) else t for t in inputs])
    torch.testing.assert_close(
        [a.cpu() for a in actual] if isinstance(actual, tuple) else actual.cpu(),
        list(expected) if isinstance(expected, tuple) else expected,
        **tolerance,
    )


def test_negative_indices_read_and_write_from_the_end():
    x = torch.randn(5, 4)
    index = torch.tensor([-1, 0, -3, 3])  # rows 4, 0, 2, 3: no row twice, so a plain put is well defined
    check(lambda t, i: t[i], x, index)
    check(lambda t, i: t[:, i[:2]], x, index)

    def put(t, i):
        t = t.clone()
        t[i] = torch.arange(4.0, device=t.device).unsqueeze(1).expand(4, 4)
        return t

    check(put, x, index)
    check(lambda t, i: t.index_put((i,), torch.ones(4, device=t.device), accumulate=True), x, torch.tensor([-1, -1, 2, 0]))


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_writing_through_a_boolean_mask():
    x = torch.randn(5, 3)
    mask = torch.rand(5) > 0.5
    check(lambda t, m: t.index_put((m,), torch.tensor(7.0)), x, mask)


def test_ops_whose_single_op_lowering_is_wrong():
    x = torch.randn(6, 5) * 2
    check(lambda t: torch.nn.functional.softshrink(t, 0.5), x)
    check(lambda t: t.renorm(2, -1, 0.5), x)
    check(lambda t, s: torch.select_scatter(t, s, -1, -1), x, torch.randn(6))
    check(lambda t, s: torch.select_scatter(t, s, 0, -2), x, torch.randn(5))


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_logcumsumexp_goes_to_the_fallback():
    check(lambda t: torch.logcumsumexp(t, 1), torch.randn(4, 6) * 5)


def test_reductions_of_0d_tensors():
    x = torch.randn(())
    check(lambda t: t.amax(0), x)
    check(lambda t: t.argmax(-1), x)
    check(lambda t: torch.max(t, 0), x)
    check(lambda t: torch.min(t, -1, keepdim=True), x)


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_an_op_whose_lowering_cannot_be_traced_goes_to_the_fallback():
    # take's decomposition has a data-dependent shape for 0-d inputs, so tracing it fails.
    check(lambda t, i: torch.take(t, i), torch.randn(()), torch.tensor(0))


def test_gradient_of_sgn_asks_for_efficient_zeros():
    x = torch.randn(6, requires_grad=True)
    (expected,) = torch.autograd.grad(torch.sgn(x).sum(), x)
    xd = x.detach().to(D).requires_grad_()
    (actual,) = torch.autograd.grad(torch.sgn(xd).sum(), xd)
    torch.testing.assert_close(actual.cpu(), expected)
