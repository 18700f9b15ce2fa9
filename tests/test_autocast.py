"""torch.autocast("turbine") casts as autocast does on CUDA (issue 19, item 4)."""

from __future__ import annotations

import copy

import pytest
import torch

from checks import D


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmuls_and_convolutions_run_in_the_autocast_dtype(dtype):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    image, kernel = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3)
    with torch.autocast("turbine", dtype=dtype):
        product = a.to(D) @ b.to(D)
        linear = torch.nn.functional.linear(a.to(D), b.t().to(D))
        conv = torch.nn.functional.conv2d(image.to(D), kernel.to(D))
    assert product.dtype == linear.dtype == conv.dtype == dtype
    torch.testing.assert_close(product.cpu(), a.to(dtype) @ b.to(dtype))
    torch.testing.assert_close(linear.cpu(), torch.nn.functional.linear(a.to(dtype), b.t().to(dtype)))
    torch.testing.assert_close(conv.cpu(), torch.nn.functional.conv2d(image.to(dtype), kernel.to(dtype)), rtol=2e-2, atol=2e-2)


def test_ops_that_need_range_run_in_float32_and_mixed_inputs_take_the_widest():
    x = torch.randn(4, 6)
    with torch.autocast("turbine", dtype=torch.bfloat16):
        low = x.to(D) @ torch.eye(6).to(D)  # bfloat16
        assert low.dtype == torch.bfloat16
        for result in (low.exp(), torch.softmax(low, -1), low.sum(), torch.nn.functional.mse_loss(low, low)):
            assert result.dtype == torch.float32
        torch.testing.assert_close(low.exp().cpu(), low.cpu().float().exp())
        assert torch.cat([low, x.to(D)]).dtype == torch.float32
        assert (low + 1).dtype == torch.bfloat16  # not in a list: as it comes
        wide = x.double().to(D)
        assert (wide @ wide.t()).dtype == torch.float64  # float64 is left alone


def test_outside_autocast_or_disabled_nothing_is_cast():
    x = torch.randn(3, 3).to(D)
    assert (x @ x).dtype == torch.float32
    with torch.autocast("turbine", dtype=torch.bfloat16, enabled=False):
        assert (x @ x).dtype == torch.float32


def test_training_under_autocast_keeps_float32_parameters_and_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(D)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8).to(D), torch.randn(32, 2).to(D)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        with torch.autocast("turbine", dtype=torch.bfloat16):
            out = model(x)
            assert out.dtype == torch.bfloat16
            loss = torch.nn.functional.mse_loss(out, y)
        loss.backward()
        assert all(p.dtype == p.grad.dtype == torch.float32 for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_grad_scaler_unscales_skips_non_finite_steps_and_updates_its_scale_as_on_the_cpu():
    """``torch.amp.GradScaler("turbine")``, the mixed-precision recipe: its unscale op writes a
    list of gradients and returns nothing, which turbine's in-place path could not do (every
    ``scaler.step`` failed). A step with an infinite gradient is skipped and halves the scale."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ours = copy.deepcopy(model).to(D)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    scales = {}
    for m, device in ((model, "cpu"), (ours, D)):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(torch.device(device).type, init_scale=2.0**10, growth_interval=2)
        scales[device] = []
        for step in range(4):
            optimizer.zero_grad()
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(m(x.to(device)), y.to(device))
            scaler.scale(loss).backward()
            if step == 1:
                m[0].weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
            scales[device].append(scaler.get_scale())
    assert scales[D] == scales["cpu"] == [1024.0, 512.0, 512.0, 1024.0]
    for p, q in zip(ours.parameters(), model.parameters()):  # bfloat16 products: a rounding apart at most
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize(
    "scale, good_steps, found_inf",
    [(65536.0, 0, 0.0), (65536.0, 1, 0.0), (65536.0, 1, 1.0), (2.0**-20, 0, float("nan")), (3e38, 1, 0.0)],
    ids=["counts a good step", "grows after the interval", "backs off after an inf", "backs off after a NaN", "would overflow"],
)
def test_the_scale_update_runs_on_iree_as_torchs(scale, good_steps, found_inf, stats):
    """GradScaler.update's op (``_amp_update_scale_``): IREE 3.13 could not compile it, so every
    mixed-precision step fell back once. Scale and count of good steps match torch's, written in
    place."""
    expected = [torch.tensor(scale), torch.tensor(good_steps, dtype=torch.int32)]
    actual = [t.to(D) for t in expected]
    torch._amp_update_scale_(*expected, torch.tensor(found_inf), 2.0, 0.5, 2)
    torch._amp_update_scale_(*actual, torch.tensor(found_inf).to(D), 2.0, 0.5, 2)
    for a, e in zip(actual, expected):
        assert torch.equal(a.cpu(), e)
    assert stats()["fallbacks"] == {}
