"""Ops defined in Python with ``torch.library.custom_op`` run their own body on turbine tensors
(eager/custom_ops.py): each op inside is planned like any other, where the op planned whole went
to the fallback. A body that fails on turbine tensors, one for a single device type, and one
that writes its arguments go the planned way (the fallback policy) and still give torch's
result."""

from __future__ import annotations

import pytest
import torch

import turbine
from checks import D
from turbine.eager import dispatch

F = torch.nn.functional


@torch.library.custom_op("turbine_test::scaled_softplus", mutates_args=())
def scaled_softplus(x: torch.Tensor, scale: float) -> torch.Tensor:
    return F.softplus(x) * scale


@scaled_softplus.register_fake
def _(x, scale):
    return torch.empty_like(x)


@torch.library.custom_op("turbine_test::linear_map", mutates_args=())
def linear_map(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


@linear_map.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("turbine_test::through_numpy", mutates_args=())
def through_numpy(x: torch.Tensor) -> torch.Tensor:
    """A body that reads its input's memory on the host (no turbine tensor gives numpy() that)."""
    return torch.from_numpy(x.numpy() * 2).to(x.device)


@through_numpy.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("turbine_test::cpu_only", mutates_args=(), device_types="cpu")
def cpu_only(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@cpu_only.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("turbine_test::add_into", mutates_args=("out",))
def add_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.add_(x)


def test_a_python_custom_op_runs_its_body_on_turbine(stats):
    x = torch.randn(4, 5)
    with turbine.fallback("error"):
        result = scaled_softplus(x.to(D), 3.0)
    torch.testing.assert_close(result.cpu(), scaled_softplus(x, 3.0))
    assert stats()["fallbacks"] == {}
    assert "custom" in dispatch.route_name(torch.ops.turbine_test.scaled_softplus.default)


@pytest.mark.parametrize("reduction", ["mean", "none"])  # "sum" takes mean's way
def test_chunked_linear_cross_entropy_runs_on_turbines_ops_with_torchs_gradients(reduction, stats):
    """``F.linear_cross_entropy`` with chunking options is torch's own Python custom op
    (``torch_nn::``), an LLM head's memory-saving loss."""
    if not hasattr(torch.nn, "LinearCrossEntropyOptions"):
        pytest.skip(f"torch {torch.__version__} has no chunked linear_cross_entropy (torch.nn.LinearCrossEntropyOptions)")
    torch.manual_seed(0)
    x, w, b = torch.randn(37, 16), torch.randn(50, 16), torch.randn(50)
    target = torch.randint(0, 50, (37,))
    target[3] = -100  # ignored
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=8)
    leaves = [[t.clone().requires_grad_() for t in (x, w, b)], [t.to(D).requires_grad_() for t in (x, w, b)]]
    losses = []
    for (xx, ww, bb), tt in zip(leaves, (target, target.to(D))):
        with turbine.fallback("error"):
            loss = F.linear_cross_entropy(xx, ww, tt, linear_bias=bb, reduction=reduction, options=options)
            (loss.sum() if reduction == "none" else loss).backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1].cpu(), losses[0])
    for torchs, ours in zip(*leaves):
        torch.testing.assert_close(ours.grad.cpu(), torchs.grad, rtol=1e-4, atol=1e-5)
    assert stats()["fallbacks"] == {}


def test_a_body_that_fails_on_turbine_tensors_goes_the_planned_way(stats):
    x = torch.randn(3)
    torch.testing.assert_close(through_numpy(x.to(D)).cpu(), x * 2)
    torch.testing.assert_close(through_numpy(x.to(D)).cpu(), x * 2)
    assert stats()["fallbacks"] == {"turbine_test.through_numpy.default": 2}
    assert "custom" in dispatch.route_name(torch.ops.turbine_test.through_numpy.default)  # tried first each call


def test_a_wrong_call_raises_the_bodys_error_and_later_calls_still_run_the_body(stats):
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        linear_map(torch.randn(2, 3).to(D), torch.randn(4, 5).to(D)).cpu()
    x, w = torch.randn(2, 3), torch.randn(3, 5)
    with turbine.fallback("error"):
        torch.testing.assert_close(linear_map(x.to(D), w.to(D)).cpu(), x @ w)


@torch.library.custom_op("turbine_test::returns_its_input", mutates_args=())
def returns_its_input(x: torch.Tensor) -> torch.Tensor:
    return x


@torch.library.custom_op("turbine_test::returns_a_view", mutates_args=())
def returns_a_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@pytest.mark.parametrize("op", [returns_its_input, returns_a_view], ids=["its input", "a view of it"])
def test_a_body_returning_its_input_raises_torchs_error(op):
    """torch checks that a custom op's result aliases no input as it runs the body on its own
    devices: a result that did would let a write through it change the input."""
    with pytest.raises(RuntimeError, match="may not alias any inputs"):
        op(torch.randn(4).to(D))


@pytest.mark.parametrize("op", ["cpu_only", "add_into"])
def test_a_body_for_one_device_type_or_one_that_writes_is_not_run_as_turbines(op, stats):
    x = torch.randn(3)
    if op == "cpu_only":
        torch.testing.assert_close(cpu_only(x.to(D)).cpu(), x + 1)
        name = "turbine_test.cpu_only.default"
    else:
        out = torch.zeros(3).to(D)
        add_into(x.to(D), out)
        torch.testing.assert_close(out.cpu(), x)
        name = "turbine_test.add_into.default"
    assert stats()["fallbacks"] == {name: 1}
