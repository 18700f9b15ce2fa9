"""Autograd, optimizers and modules on turbine devices, against torch on the CPU."""

import copy

import pytest
import torch

import turbine
from checks import D



def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def train(model, x, target, device, steps=3):
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, target = x.to(device), target.to(device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def test_mlp_training_matches_cpu():
    x, target = torch.randn(10, 8), torch.randint(0, 4, (10,))
    reference, expected = train(mlp(), x, target, "cpu")
    model, losses = train(mlp(), x, target, D)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), atol=1e-5, rtol=1e-5)


def test_adam_step_matches_cpu():
    model = mlp()
    twin = copy.deepcopy(model).to(D)
    x = torch.randn(6, 8)
    for m, data in [(model, x), (twin, x.to(D))]:
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        for _ in range(2):
            opt.zero_grad()
            m(data).square().mean().backward()
            opt.step()
    for p, q in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), atol=1e-5, rtol=1e-5)


def test_max_dim_backward():
    x = torch.randn(5, 6, requires_grad=True)
    xd = x.detach().to(D).requires_grad_()
    torch.max(x, dim=1).values.sum().backward()
    torch.max(xd, dim=1).values.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_gradient_flows_back_to_a_cpu_leaf():
    w = torch.randn(3, 3, requires_grad=True)
    (w.to(D) * 2).sum().backward()
    torch.testing.assert_close(w.grad, torch.full((3, 3), 2.0))


def test_backward_on_a_second_device():
    x = torch.randn(4, 4, requires_grad=True)
    xd = x.detach().to("turbine:cpu1").requires_grad_()
    (xd.exp() * xd).sum().backward()
    (x.exp() * x).sum().backward()
    assert xd.grad.device == xd.device
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_backward_across_two_devices():
    x = torch.randn(3, 3, requires_grad=True)
    a = x.detach().to("turbine:cpu").requires_grad_()
    b = (a * 3).to("turbine:cpu1")
    b.sin().sum().backward()
    torch.sin(x * 3).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), x.grad)
    assert a.grad.device == a.device


def test_plans_are_per_device():
    """The same op and shapes on two devices: each result is on its own device (a plan cached for
    one device once produced tensors of the other, and backward then failed inside torch's engine)."""
    first = torch.ones_like(torch.randn(3, device="turbine:cpu").sum())
    second = torch.ones_like(torch.randn(3, device="turbine:cpu1").sum())
    assert first.device != second.device
    assert second.device == torch.randn(1, device="turbine:cpu1").device


BACKWARD_CALLS = {
    "Tensor.backward": lambda loss, x: loss.backward(),
    "autograd.backward": lambda loss, x: torch.autograd.backward(loss),
    "autograd.grad": lambda loss, x: torch.autograd.grad(loss, x),
}


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
@pytest.mark.parametrize("call", sorted(BACKWARD_CALLS))
def test_an_error_inside_backward_reaches_the_caller(call):
    """matrix_exp's gradient needs matrix_exp again, which IREE cannot run: under the "error"
    fallback policy that op fails inside backward. The error must come out of the backward call
    (torch's Python device guard would otherwise end the process), and the process must carry on."""
    x = (torch.rand(3, 3) - 0.5).to("turbine:cpu").requires_grad_()
    loss = torch.linalg.matrix_exp(x).sum()
    # IREE alone: the vendor executor (TURBINE_EXECUTORS=all) would run matrix_exp with torch's kernel
    with turbine.override(executors="iree"), turbine.fallback("error"), pytest.raises(turbine.UnsupportedOpError, match="matrix_exp"):
        BACKWARD_CALLS[call](loss, x)
    y = torch.randn(4, device="turbine:cpu", requires_grad=True)
    (y * y).sum().backward()
    torch.testing.assert_close(y.grad.cpu(), 2 * y.detach().cpu())


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_an_error_inside_backward_from_an_op_without_a_shape_rule_reaches_the_caller():
    """The stand-in autograd gets while an error inside backward is held took its shapes from
    torch's shape rule: for an op with none (_masked_softmax_backward, multilabel_margin_loss's
    until it had one) that failed too, and the process ended (std::terminate). Its shapes now
    come from the op run on zeros on the CPU, and the error reaches the caller."""
    x = torch.randn(3, 5).to("turbine:cpu").requires_grad_()
    mask = (torch.rand(3, 5) > 0.7).to("turbine:cpu")
    y = torch._masked_softmax(x, mask, 1, 0)  # no shape rule either: torch's kernel over the device memory
    with turbine.fallback("error"), pytest.raises(turbine.UnsupportedOpError, match="_masked_softmax_backward.*no shape rule"):
        y.sum().backward()
    (x * x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), 2 * x.detach().cpu())


def test_leaky_relu_gradient():
    """IREE 3.13 miscompiles leaky_relu_backward as one op (ops/corrections.py)."""
    x = torch.randn(6, 5, requires_grad=True)
    upstream = torch.randn(6, 5)
    (expected,) = torch.autograd.grad(torch.nn.functional.leaky_relu(x, 0.2), x, upstream)
    xd = x.detach().to(D).requires_grad_()
    (actual,) = torch.autograd.grad(torch.nn.functional.leaky_relu(xd, 0.2), xd, upstream.to(D))
    torch.testing.assert_close(actual.cpu(), expected)


def test_multithreaded_backward_through_a_second_turbine_device():
    """torch's autograd keeps one device-thread queue per device index, as many as its device
    guards report (one for a Python backend): a multi-threaded backward through turbine's second
    device failed torch's internal assert. turbine runs such a backward on the calling thread."""
    torch.ones(1, device="turbine:cpu")  # two turbine devices open: the second has index >= 1
    x = torch.randn(4, 3, requires_grad=True)
    xd = x.detach().to("turbine:cpu1").requires_grad_()
    with torch.autograd.set_multithreading_enabled(True):
        (xd.tanh() * 2).sum().backward()
        assert torch.autograd.is_multithreading_enabled()  # only that backward ran single-threaded
    (x.tanh() * 2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
