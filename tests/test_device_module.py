"""torch.turbine / turbine as torch.cuda users reach for them (issue 19, item 1): the current
device, synchronize, memory figures and seeds."""

from __future__ import annotations

import gc

import pytest
import torch

import turbine
from checks import D


def test_torch_turbine_is_the_device_module():
    assert torch.get_device_module("turbine") is torch.turbine
    assert torch.turbine.is_available()
    for name in (
        "current_device", "set_device", "synchronize", "memory_allocated", "max_memory_allocated",
        "reset_peak_memory_stats", "memory_stats", "empty_cache", "manual_seed", "seed",
        "get_rng_state", "set_rng_state",
    ):
        assert callable(getattr(torch.turbine, name)), name


def test_synchronize_waits_for_every_launched_op():
    x = torch.randn(64, 64).to(D)
    with turbine.override(background_compile=False):
        (x @ x).cpu()  # compiled before the launches below
        results = [x @ x for _ in range(20)]
    torch.turbine.synchronize(D)
    for result in results:
        ready = result._storage.buffer.ready
        assert ready is None or ready.wait(timeout=0), "a launch was still running after synchronize"


def test_synchronize_launches_ops_whose_kernels_were_compiling(fresh_cache):
    x = torch.rand(7, 53).to(D)
    y = torch.special.i0(x)  # a new kernel: compiles in the background, its launch queued
    assert y._storage.buffer.pending
    turbine.synchronize()
    assert not y._storage.buffer.pending
    torch.testing.assert_close(y.cpu(), torch.special.i0(x.cpu()))


def test_memory_figures_count_live_tensors_and_fall_when_they_die():
    gc.collect()
    base = turbine.memory_allocated(D)
    turbine.reset_peak_memory_stats(D)
    x = torch.zeros(256, 1024, device=D)
    assert turbine.memory_allocated(D) - base == 256 * 1024 * 4
    y = x + 1
    z = y * 3
    turbine.synchronize(D)
    assert turbine.max_memory_allocated(D) - base >= 3 * 256 * 1024 * 4
    del x, y, z
    gc.collect()
    assert turbine.memory_allocated(D) == base
    stats = turbine.memory_stats(D)
    assert stats["allocated_bytes.all.current"] == base
    assert stats["allocated_bytes.all.peak"] >= base + 3 * 256 * 1024 * 4
    turbine.reset_peak_memory_stats(D)
    assert turbine.max_memory_allocated(D) == base
    turbine.empty_cache()


def test_set_device_sets_what_plain_turbine_means_on_this_thread():
    import threading

    before = turbine.current_device()
    try:
        torch.turbine.set_device("turbine:cpu1")
        assert torch.ones(2, device="turbine").device == torch.device("turbine:cpu1")
        assert torch.turbine.current_device() == turbine.device("turbine:cpu1").index
        seen = []
        thread = threading.Thread(target=lambda: seen.append(turbine.current_device()))
        thread.start()
        thread.join()
        assert seen == [turbine.device(turbine.config.default_device)]  # other threads keep theirs
        with turbine.device("turbine:cpu"):
            assert turbine.current_device().name == "turbine:cpu"
    finally:
        torch.turbine.set_device(before)


def test_manual_seed_gives_torch_cpu_numbers():
    torch.turbine.manual_seed(7)
    ours = torch.randn(5, device=D).cpu()
    torch.manual_seed(7)
    torch.testing.assert_close(ours, torch.randn(5))


def test_device_arguments_name_devices_every_way():
    from turbine.eager.device_module import resolve

    device = turbine.device(D)
    assert resolve(None) is turbine.current_device()
    assert resolve(D) is resolve(device.index) is resolve(torch.device("turbine", device.index)) is device
    with pytest.raises(ValueError, match="is not a turbine device"):
        resolve(torch.device("cpu"))
    with pytest.raises(TypeError, match="expected a turbine device"):
        resolve(1.5)


def test_pin_memory_gives_an_ordinary_copy_and_a_dataloader_pins_nothing():
    x = torch.randn(4, 3)
    pinned = x.pin_memory()
    assert torch.equal(pinned, x) and pinned.data_ptr() != x.data_ptr()
    assert not x.is_pinned()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4, pin_memory=True)
    for (batch,) in loader:
        torch.testing.assert_close((batch.to(D) * 2).cpu(), batch * 2)


ACCELERATOR_SCRIPT = """
import torch, turbine
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
# As PyTorch's MNIST example picks and feeds its device, before any turbine op has run.
device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
assert device.type == "turbine", device
torch.manual_seed(0)
kwargs = {"num_workers": 1, "persistent_workers": True, "pin_memory": True, "shuffle": True}
loader = DataLoader(TensorDataset(torch.randn(64, 1, 12, 12), torch.randint(0, 10, (64,))), batch_size=16, **kwargs)
model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(400, 10)).to(device)
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
print(torch.device("turbine:cpu"), next(model.parameters()).device, loss.item())
"""


@pytest.mark.slow  # a new process
def test_a_script_written_for_torch_accelerator_runs_on_turbine():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", ACCELERATOR_SCRIPT], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    first, second, loss = result.stdout.split()[-3:]
    assert first == second == "turbine:0" and float(loss) == float(loss)  # not NaN


def test_a_dataloader_fed_loop_with_non_blocking_copies_trains_like_the_cpu():
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 6), torch.randn(48, 2))

    def train(device: str) -> list[float]:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 2)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True)
        losses = []
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return [float(v) for v in losses]  # read once, at the end: the loop never waits for the device

    assert train(D) == pytest.approx(train("cpu"), rel=1e-5)
