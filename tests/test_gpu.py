"""GPU checks; they run where IREE's cuda driver sees a device (the H200 device machine) and skip elsewhere."""

import pytest
import torch

import turbine

GPU = "turbine:cuda0"
pytestmark = pytest.mark.skipif(GPU not in turbine.devices(), reason="no CUDA device visible to IREE here")


def test_demo_on_gpu():
    x, w = torch.randn(64, 128), torch.randn(128, 32)
    y = torch.relu(x.to(GPU) @ w.to(GPU) + 1.0)
    v, i = torch.max(y, dim=1)
    expected = torch.relu(x @ w + 1.0).max(dim=1)
    torch.testing.assert_close(v.cpu(), expected.values, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(i.cpu(), expected.indices)


def test_views_and_in_place_on_gpu():
    x = torch.randn(6, 5)
    xd = x.to(GPU)
    xd[0].add_(1)
    xd.t()[1:3].mul_(2)
    expected = x.clone()
    expected[0].add_(1)
    expected.t()[1:3].mul_(2)
    torch.testing.assert_close(xd.cpu(), expected)


def test_backward_on_gpu():
    x = torch.randn(5, 4, requires_grad=True)
    xd = x.detach().to(GPU).requires_grad_()
    (xd.tanh() * xd).sum().backward()
    (x.tanh() * x).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, atol=1e-5, rtol=1e-5)


def test_mixed_gpu_and_cpu_devices_fail_like_torch():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, device=GPU) + torch.ones(2, device="turbine:cpu")
