"""``turbine.graphed`` (eager/graphs.py): a function whose ops all run on the vendor executor,
replayed as one CUDA graph. The replay tests need a GPU torch and IREE both see; elsewhere the
function runs eagerly, which the CPU tests show."""

from __future__ import annotations

import copy

import pytest
import torch

import turbine
from turbine.config import override
from turbine.eager.tensor import DeviceTensor
from checks import D, winner

GPU = "turbine:cuda0"
on_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and GPU in turbine.devices()), reason="no CUDA device visible to IREE and torch here"
)


def mlp_and_data(device: str, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    batches = [(torch.randn(16, 32), torch.randn(16, 8)) for _ in range(8)]
    return model, [(x.to(device), y.to(device)) for x, y in batches]


def trainer(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def train(device: str, graphed: bool, capturable: bool = True, steps: int = 10):
    """Losses of ``steps`` AdamW steps of the MLP on ``device``, eagerly or graphed; and the step."""
    model, batches = mlp_and_data("cpu")
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True, capturable=capturable and device != "cpu")
    step = trainer(model, optimizer)
    if graphed:
        step = turbine.graphed(step)
    losses = [step(x.to(device), y.to(device)).item() for x, y in (batches * 2)[:steps]]
    return losses, step, model


def test_the_warmup_must_make_the_optimizers_state():
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        turbine.graphed(lambda: None, warmup=0)


@pytest.mark.skipif(D.startswith("turbine:cuda"), reason="the CPU devices' eager path")
def test_off_a_gpu_the_function_runs_eagerly():
    losses, step, _ = train(D, graphed=True, capturable=False)
    expected, _, _ = train("cpu", graphed=False)
    assert not step.captures and step.calls == 0
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-5)


@pytest.fixture
def gpu_vendor(monkeypatch):
    """The vendor executor on the GPU, winning every timing (small layers may time faster on
    IREE's kernels, which keeps a function eager: another test), kernels compiled in the
    foreground so that the warm-up settles in a few calls; plans made afresh (a plan made with
    the vendor off, by another test, runs IREE's kernels)."""
    winner("vendor", monkeypatch)
    turbine.eager.dispatch.clear_plans()
    with override(executors="auto", background_compile=False):
        yield
    turbine.eager.dispatch.clear_plans()


@on_gpu
def test_a_training_step_is_captured_and_replayed_with_eagers_losses(gpu_vendor, monkeypatch, stats):
    eager, _, eager_model = train(GPU, graphed=False, steps=12)
    model, batches = mlp_and_data("cpu")
    model = model.to(GPU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True, capturable=True)
    step = turbine.graphed(trainer(model, optimizer))
    batches = (batches * 2)[:12]
    losses = [step(x.to(GPU), y.to(GPU)).item() for x, y in batches[:8]]  # warm-up, capture, replays
    assert len(step.captures) == 1, step.eager_why
    dispatched: list[str] = []
    real = DeviceTensor.dispatcher
    monkeypatch.setattr(DeviceTensor, "dispatcher", lambda f, a, k: dispatched.append(str(f)) or real(f, a, k))
    replays = stats()["graph_replays"]
    for x, y in batches[8:]:
        x, y = x.to(GPU), y.to(GPU)
        dispatched.clear()
        loss = step(x, y)
        assert dispatched == []  # the whole step in one replay: no op dispatched
        losses.append(loss.item())
    assert stats()["graph_replays"] == replays + 4
    torch.testing.assert_close(losses, eager, rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(mine.cpu(), theirs.cpu(), rtol=1e-4, atol=1e-5)


@on_gpu
def test_numbers_that_change_each_call_keep_the_function_eager(gpu_vendor):
    """AdamW without ``capturable`` computes its bias corrections on the host, new each step."""
    losses, step, _ = train(GPU, graphed=True, capturable=False)
    expected, _, _ = train("cpu", graphed=False)
    assert not step.captures and "differ from one call to the next" in step.eager_why
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-5)


@on_gpu
def test_iree_kernels_keep_the_function_eager():
    with override(executors="iree"):
        losses, step, _ = train(GPU, graphed=True, capturable=True, steps=6)
    expected, _, _ = train("cpu", graphed=False, steps=6)
    assert not step.captures and "dispatches" in step.eager_why
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-5)


@on_gpu
def test_a_parameter_changed_outside_takes_a_new_capture(gpu_vendor):
    model, batches = mlp_and_data(GPU)
    model = model.to(GPU)
    reference = copy.deepcopy(model)
    forward = turbine.graphed(lambda x: model(x))
    with torch.no_grad():
        for x, _ in batches * 2:
            torch.testing.assert_close(forward(x).cpu(), reference(x).cpu())
        assert len(forward.captures) == 1, forward.eager_why
        model[0].weight.mul_(2)  # a new buffer in the weight's storage
        reference[0].weight.mul_(2)
        for x, _ in batches:
            torch.testing.assert_close(forward(x).cpu(), reference(x).cpu())
        assert len(forward.captures) == 1 and forward.captures[next(iter(forward.captures))].still_reads()


@on_gpu
def test_results_are_copies_the_next_replay_leaves_alone(gpu_vendor):
    w = torch.randn(8, 8).to(GPU)
    double = turbine.graphed(lambda x: (x @ w) * 2)
    xs = [torch.randn(4, 8) for _ in range(10)]
    with torch.no_grad():
        results = [double(x.to(GPU)) for x in xs]
    assert len(double.captures) == 1, double.eager_why
    for x, result in zip(xs, results):
        torch.testing.assert_close(result.cpu(), (x @ w.cpu()) * 2, rtol=1e-4, atol=1e-4)
