import os
import subprocess
import sys

import pytest
import torch

import turbine
from turbine.config import default_cpu_workers
from turbine.device import registry
from turbine.device.names import parse


def test_device_names_parse_to_canonical_forms():
    assert parse("turbine:cpu").canonical == "turbine:cpu"
    assert parse("turbine:cpu0").canonical == "turbine:cpu"
    assert parse("turbine:cpu1").canonical == "turbine:cpu1"
    assert parse("turbine:cpu:sync").driver == "local-sync"
    assert parse("turbine:cuda0").driver == "cuda"
    assert parse("turbine:cuda").canonical == "turbine:cuda0"
    assert parse("turbine:hip1").canonical == "turbine:hip1"
    assert parse("turbine:vulkan0").driver == "vulkan"
    assert parse("turbine").kind is None
    assert parse("turbine:2").torch_index == 2


@pytest.mark.parametrize("name", ["turbine:foo", "turbine:cuda:sync", "turbine:cpu-1", "turbine:"])
def test_malformed_names_list_the_accepted_forms(name):
    with pytest.raises(turbine.DeviceNotFoundError, match="Invalid turbine device name"):
        torch.zeros(2, device=name)


def test_missing_gpu_device_lists_what_can_be_opened():
    count = sum(1 for n in turbine.devices() if n.startswith("turbine:cuda"))
    with pytest.raises(turbine.DeviceNotFoundError, match="Devices that can be opened: turbine:cpu"):
        torch.zeros(2, device=f"turbine:cuda{count}")


def test_devices_lists_cpu_devices():
    names = turbine.devices()
    assert "turbine:cpu" in names and "turbine:cpu:sync" in names


def test_each_device_maps_to_one_torch_index():
    a = torch.ones(2, device="turbine:cpu")
    b = torch.ones(2, device="turbine:cpu1")
    assert a.device.type == "turbine" and b.device.type == "turbine"
    assert a.device.index != b.device.index
    assert turbine.device("turbine:cpu").index == a.device.index
    assert torch.ones(1, device=a.device).device == a.device


def test_plain_turbine_is_the_current_device():
    assert torch.ones(1, device="turbine").device.index == turbine.device("turbine:cpu").index
    with turbine.device("turbine:cpu1") as dev:
        x = torch.ones(1, device="turbine")
        assert x.device.index == dev.index
        assert turbine.current_device() is dev
    assert turbine.current_device().name == "turbine:cpu"


def test_local_sync_device_runs_kernels():
    x = torch.randn(8, 8)
    y = x.to("turbine:cpu:sync")
    torch.testing.assert_close((y @ y).cpu(), x @ x)


def test_repr_prints_values_and_turbine_name():
    x = torch.randn(3, 2)
    text = repr(x.to("turbine:cpu"))
    assert text == repr(x)[:-1] + ", device='turbine:cpu')"
    half = torch.arange(3, dtype=torch.float16)
    assert repr(half.to("turbine:cpu")) == "tensor([0., 1., 2.], device='turbine:cpu', dtype=torch.float16)"
    assert "requires_grad=True" in repr(torch.ones(2, device="turbine:cpu", requires_grad=True))


def test_a_zero_dim_tensor_formats_as_its_number():
    """``print(f"loss {loss:.4f}")``: torch formats a 0-d tensor of class torch.Tensor alone."""
    x = torch.randn(3, 2)
    on_device = x.to("turbine:cpu")
    for spec in (".4f", "8.2e", "", "+.1%"):
        assert format(on_device[1, 0], spec) == format(x[1, 0], spec)
    assert format(on_device.sum().requires_grad_(), ".3f") == format(on_device.sum().item(), ".3f")
    assert f"{on_device}" == repr(on_device)
    with pytest.raises(TypeError, match="unsupported format string"):
        format(on_device, ".3f")


def test_unknown_device_option_is_rejected():
    with pytest.raises(TypeError, match="unknown option"):
        turbine.device("turbine:cpu3", fast=True)


_WORKER_THREADS = """
import os, torch, turbine
x = torch.randn(8, device="turbine:cpu")
torch.testing.assert_close((x + x).cpu(), x.cpu() * 2)
def name(task):  # a thread (one of CUDA's, say) may end between the listing and the read
    try:
        return open(f"/proc/self/task/{task}/comm").read().strip()
    except FileNotFoundError:
        return ""
print(sum(name(t).startswith("iree-worker") for t in os.listdir("/proc/self/task")))
"""


def _run_python(script: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
@pytest.mark.parametrize("workers", ["1", "2"])
def test_cpu_worker_count_follows_the_setting(workers):
    result = _run_python(_WORKER_THREADS, TURBINE_CPU_WORKERS=workers)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == workers


_WAKE_UPS = """
import resource, torch, turbine
x = torch.randn(4, 8, device="turbine:cpu")
y = (x + x)
y.cpu()
before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
for _ in range(3000):
    y = y + x
y.cpu()
print((resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before) / 3000)
"""


def _spare_cores() -> int:
    """Cores this process may use that no other test process holds: pytest-xdist's workers
    (``-n``) each keep one busy."""
    return len(os.sched_getaffinity(0)) - int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


@pytest.mark.alone
@pytest.mark.skipif(
    _spare_cores() < 1,
    reason="a spinning worker needs a core of its own, and the test processes beside this one hold every core; "
    "the tests marked alone run by themselves after the rest: python -m pytest -q -m alone",
)
def test_spinning_cpu_worker_needs_no_wake_up_per_small_op():
    """Asleep between ops, the IREE worker is woken by a system call for each op (a voluntary
    context switch); spinning, it picks the next op up by itself. Counts, not times: CI is noisy."""
    spinning = _run_python(_WAKE_UPS, TURBINE_CPU_SPIN_US="100", TURBINE_CPU_WORKERS="1")
    sleeping = _run_python(_WAKE_UPS, TURBINE_CPU_SPIN_US="0", TURBINE_CPU_WORKERS="1")
    assert spinning.returncode == 0 and sleeping.returncode == 0, spinning.stderr + sleeping.stderr
    per_op_spinning, per_op_sleeping = float(spinning.stdout.split()[-1]), float(sleeping.stdout.split()[-1])
    assert per_op_spinning < per_op_sleeping / 2, (per_op_spinning, per_op_sleeping)


def test_runtime_flags_set_worker_spin_unless_the_user_does():
    with turbine.override(cpu_spin_us=70, runtime_flags=()):
        assert "--task_worker_spin_us=70" in registry.runtime_flags()
    with turbine.override(cpu_spin_us=70, runtime_flags=("--task_worker_spin_us=5",)):
        assert [f for f in registry.runtime_flags() if "spin" in f] == ["--task_worker_spin_us=5"]


def test_default_cpu_workers_leave_a_core_for_the_issuing_thread():
    cores = len(os.sched_getaffinity(0))
    assert default_cpu_workers() == max(1, cores - 1)
    assert turbine.config.cpu_workers == int(os.environ.get("TURBINE_CPU_WORKERS") or max(1, cores - 1))


def test_bad_runtime_flags_name_the_variable():
    result = _run_python("import torch, turbine; torch.zeros(2, device='turbine:cpu')", TURBINE_RUNTIME_FLAGS="--no_such_flag=1")
    assert result.returncode != 0
    assert "TURBINE_RUNTIME_FLAGS" in result.stderr and "no_such_flag" in result.stderr


def test_devices_whose_waits_poll_run_bursts_and_reads_as_others_do(fresh_cache, monkeypatch):
    """On turbine:cuda0 the host polls a fence rather than block on it, kernel calls included
    (IREE 3.13's CUDA driver crashed on blocked host waits, device.py); here the CPU device is
    made to poll, so the path runs without a GPU: a burst of launches after compiles (the
    deferred queue), a kernel run on a copy of its input, and reads."""
    device = registry.open_device(os.environ.get("TURBINE_TEST_DEVICE", "turbine:cpu"))
    settled = []
    settle = type(device).settle
    monkeypatch.setattr(device, "polls_waits", True)
    monkeypatch.setattr(type(device), "settle", lambda self, fence: settled.append(fence) or settle(self, fence))
    x, w = torch.randn(6, 8), torch.randn(8, 8)
    xd, wd = x.to(device.name), w.to(device.name)
    y = torch.tanh(xd @ wd).t()
    copied = torch.ops.aten.unsqueeze_copy.default(y, 0)  # IREE hands its input back: run on a copy
    torch.testing.assert_close(copied.cpu(), torch.tanh(x @ w).t().unsqueeze(0))
    assert len(settled) >= 4, "every kernel call and the read went through the polling wait"
