"""A failure in one op stays in that op (issue 17, item 2): failures injected where IREE reports
them (a kernel call, an allocation) raise an error that names the op and the device, and the
device runs later ops correctly; a kernel that faults marks its device lost, and every later use
says so at once. The real fault on the GPU is in test_gpu.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from checks import D
from turbine.config import override
from turbine.device import failures, open_device
from turbine.eager import dispatch
from turbine.eager.kernel_plan import KernelPlan
from turbine.errors import DeviceError, DeviceLostError, OutOfMemoryError

OUT_OF_MEMORY = "memory_pools.c:245: RESOURCE_EXHAUSTED; CUDA error 'CUDA_ERROR_OUT_OF_MEMORY' (2): out of memory"
FAULT = "cuda_device.c:190: ABORTED; CUDA error 'CUDA_ERROR_ILLEGAL_ADDRESS' (700): an illegal memory access"


class Failing:
    """Stands in for an IREE object whose every call fails with IREE's words."""

    def __init__(self, words: str) -> None:
        self.words = words

    def __getattr__(self, name: str):
        def fail(*args, **kwargs):
            raise RuntimeError(self.words)

        return fail


def kernel_of(func, device: str):
    plans = [p for p in dispatch.plans().values() if isinstance(p, KernelPlan) and p.func is func]
    plans = [p for p in plans if p.device.name == open_device(device).name and p.kernel is not None]
    assert plans, f"no compiled kernel plan of {func} on {device}"
    return plans[-1].kernel


def test_a_kernel_out_of_memory_names_the_op_and_later_ops_run(monkeypatch):
    xc = torch.randn(4, 5)
    x = xc.to(D)
    torch.testing.assert_close((x * 3).cpu(), xc * 3)
    monkeypatch.setattr(kernel_of(torch.ops.aten.mul.Tensor, D), "context", Failing(OUT_OF_MEMORY))
    with pytest.raises(torch.OutOfMemoryError, match=r"aten\.mul\.Tensor: .* is out of memory running a kernel"):
        (x * 3).cpu()
    monkeypatch.undo()
    torch.testing.assert_close((x * 3).cpu(), xc * 3)
    torch.testing.assert_close((x + 1).sin().cpu(), (xc + 1).sin())


def test_a_failed_allocation_is_out_of_memory_and_later_allocations_work(monkeypatch):
    device = open_device(D)
    monkeypatch.setattr(device, "allocator", Failing(OUT_OF_MEMORY))
    with pytest.raises(OutOfMemoryError, match="out of memory allocating 4000 bytes"):
        torch.empty(1000, device=D)
    with pytest.raises(OutOfMemoryError, match="copying 12 bytes to it"):
        torch.tensor([1.0, 2.0, 3.0]).to(D)
    monkeypatch.undo()
    torch.testing.assert_close(torch.ones(1000, device=D).sum().cpu(), torch.tensor(1000.0))


def test_another_kernel_failure_stays_in_its_op(monkeypatch):
    xc = torch.randn(3, 2)
    x = xc.to(D)
    torch.testing.assert_close((x - 2).cpu(), xc - 2)
    monkeypatch.setattr(kernel_of(torch.ops.aten.sub.Tensor, D), "context", Failing("INTERNAL; something broke"))
    with pytest.raises(DeviceError, match=r"aten\.sub\.Tensor: .* failed running a kernel: INTERNAL; something broke"):
        (x - 2).cpu()
    monkeypatch.undo()
    torch.testing.assert_close((x - 2).cpu(), xc - 2)


def test_a_kernel_that_faults_marks_its_device_lost_and_other_devices_run_on(monkeypatch):
    """On its own CPU device (turbine:cpu7), so that no other test meets a lost device."""
    lost = "turbine:cpu7"
    # Undone after the test: a process that lost a device exits with status 1 (failures.py).
    monkeypatch.setattr(failures, "_lost_devices", [])
    monkeypatch.setattr(open_device(lost), "lost", None)
    xc = torch.randn(6)
    x = xc.to(lost)
    torch.testing.assert_close((x * 2).cpu(), xc * 2)
    kernel = kernel_of(torch.ops.aten.mul.Tensor, lost)
    real = kernel.context
    kernel.context = Failing(FAULT)
    with pytest.raises(DeviceLostError, match=r"aten\.mul\.Tensor: turbine:cpu7 is lost: a kernel faulted \(running a kernel: .*ILLEGAL_ADDRESS"):
        x * 2
    kernel.context = real  # the device is still lost: nothing runs on it
    for later in (lambda: (x + 1).cpu(), lambda: x.cpu(), lambda: torch.ones(2, device=lost)):
        with pytest.raises(DeviceLostError, match="restart the process"):
            later()
    torch.testing.assert_close((xc.to(D) * 2).cpu(), xc * 2)


def test_torchs_kernel_meeting_a_lost_context_marks_the_device_lost(monkeypatch):
    """A fault can poison the GPU context that IREE and torch share before IREE sees it: torch's
    kernel (the vendor's, the device fallback's) then fails first, in its words. That too marks
    the device lost, naming the op, instead of the vendor handing the call to IREE (and every
    later op failing in torch's words). On its own CPU device, with torch's error injected."""
    from turbine.eager import timed_plan
    from turbine.eager.executors import vendor

    lost = "turbine:cpu6"
    monkeypatch.setattr(failures, "_lost_devices", [])
    monkeypatch.setattr(open_device(lost), "lost", None)
    monkeypatch.setattr(timed_plan, "_best", lambda run: (1.0 if vendor_first.pop() else 2.0, run()))
    vendor_first = [True, False]  # timed: IREE's call 2.0 us, the vendor's 1.0: the vendor wins
    xc = torch.randn(5)
    x = xc.to(lost)
    with override(executors="all", background_compile=False):
        torch.testing.assert_close((x + x).cpu(), xc + xc)

        def fault(*args):
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors ...")

        monkeypatch.setattr(vendor, "shared_view", fault)
        with pytest.raises(DeviceLostError, match=r"turbine:cpu6 is lost: a kernel faulted \(running aten\.add\.Tensor on torch's kernel: CUDA error: an illegal memory"):
            x + x
        for later in (lambda: (x + x).cpu(), lambda: (x * 2).cpu(), lambda: x.cpu()):
            with pytest.raises(DeviceLostError, match="restart the process"):
                later()
        (plan,) = [p for p in dispatch.plans().values() if isinstance(p, timed_plan.TimedPlan) and p.device is open_device(lost)]
    assert plan.chosen == "vendor"  # the fault is not taken for a call torch has no kernel for
    torch.testing.assert_close((xc.to(D) + 1).cpu(), xc + 1)


def test_the_device_fallback_meeting_a_lost_context_marks_the_device_lost(monkeypatch):
    """The same for torch's kernel run by the ``device`` fallback policy (an op IREE cannot compile)."""
    import turbine
    from turbine.eager import host

    lost = "turbine:cpu5"
    monkeypatch.setattr(failures, "_lost_devices", [])
    monkeypatch.setattr(open_device(lost), "lost", None)
    a, b = torch.rand(4) + 1, torch.rand(4) + 1
    x, y = a.to(lost), b.to(lost)
    with turbine.fallback("device"):
        torch.testing.assert_close(torch.special.gammainc(x, y).cpu(), torch.special.gammainc(a, b))

        def fault(*args):
            raise torch.AcceleratorError("CUDA error: device-side assert triggered\nCUDA kernel errors ...")

        monkeypatch.setattr(host, "run_with_torch", fault)
        with pytest.raises(DeviceLostError, match=r"turbine:cpu5 is lost: a kernel faulted \(running aten\.igamma"):
            torch.special.gammainc(x, y).cpu()
    with pytest.raises(DeviceLostError, match="restart the process"):
        (x + 1).cpu()


def test_launch_blocking_waits_for_each_kernel(monkeypatch):
    waits = []
    device = open_device(D)
    settle = device.settle
    monkeypatch.setattr(device, "settle", lambda fence: (waits.append(fence), settle(fence))[1])
    xc = torch.randn(5)
    x = xc.to(D)
    (x * 5).cpu()
    waits.clear()
    with override(launch_blocking=True):
        y = x * 5
    assert waits, "no wait at the launch"
    torch.testing.assert_close(y.cpu(), xc * 5)


@pytest.mark.slow
def test_a_process_that_lost_a_device_exits_with_status_1_and_says_why():
    """Releasing a lost CUDA context at exit hung; the exit handler leaves first (on a CPU device here)."""
    script = textwrap.dedent(f"""
        import torch, turbine
        from turbine.device import open_device
        from turbine.errors import DeviceLostError
        x = torch.randn(4).to({D!r})
        (x * 2).cpu()
        class FaultedFence:  # what IREE's fence reports once a kernel faulted
            def wait(self, timeout=None):
                raise RuntimeError({FAULT!r})

        try:
            open_device({D!r}).settle(FaultedFence())
        except DeviceLostError:
            print("lost")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "lost", done.stderr[-3000:]
    assert done.returncode == 1
    assert "was lost; exiting without releasing it" in done.stderr
