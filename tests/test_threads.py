"""Threads (issue 20, item 2): device names work in every thread, and threads issuing ops at once
on one device and on different devices get torch's results."""

from __future__ import annotations

import _thread
import concurrent.futures
import threading

import pytest
import torch

import turbine
from checks import D


def _make_ones() -> str:
    try:
        return str(torch.ones(3, device=D).sum().item())
    except RuntimeError as error:
        return str(error)


def test_device_names_work_in_threads_started_after_import():
    found = []
    thread = threading.Thread(target=lambda: found.append(_make_ones()))
    thread.start()
    thread.join()
    timer = threading.Timer(0.01, lambda: found.append(_make_ones()))
    timer.start()
    timer.join()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        found += [f.result() for f in [pool.submit(_make_ones) for _ in range(4)]]
    assert found == ["3.0"] * 6


def test_a_thread_turbine_did_not_start_names_devices_after_enable_in_thread():
    """Threads that do not start through ``threading`` (``_thread``, C code), like threads that
    existed before ``import turbine``, enter turbine's mode with ``turbine.enable_in_thread()``."""
    found = []
    done = threading.Event()

    def bare() -> None:
        found.append(_make_ones())
        turbine.enable_in_thread()
        turbine.enable_in_thread()  # a second call changes nothing
        found.append(_make_ones())
        found.append(len(torch.overrides._get_current_function_mode_stack()))
        done.set()

    _thread.start_new_thread(bare, ())
    assert done.wait(120)
    assert "Invalid device string" in found[0] and found[1:] == ["3.0", 1]


def _worker(device: str, seed: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A mix of ops (elementwise, matmul, reductions, views, in-place writes through views) on
    ``device``, and the same on torch's CPU."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.rand(8, 8, generator=generator)
    results = []
    for target in (device, "cpu"):
        x = start.to(target)
        w = (start.T * 0.1).to(target)
        for step in range(steps):
            x = torch.tanh(x @ w + x * 0.5)
            x[step % 8, :].add_(0.25)
            x = x - x.mean(dim=1, keepdim=True)
        results.append(x.cpu())
    return results[0], results[1]


@pytest.mark.slow
def test_eight_threads_each_issue_thousands_of_ops_on_one_and_two_devices():
    devices = [D, D if D != "turbine:cpu" else "turbine:cpu1"]
    for device in devices:  # compile the kernels once, before the threads race
        _worker(device, 0, 2)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_worker, devices[i % 2], i, 400) for i in range(8)]  # 8 threads x 2400 ops
        for future in futures:
            ours, expected = future.result()
            torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_the_mode_can_be_suspended_on_a_thread_for_a_while():
    """``mode.suspended()`` (what benchmarks time torch with) takes turbine's function mode off
    this thread and puts it back: inside, torch cannot parse a turbine name; outside, it can."""
    from turbine.eager import mode

    with mode.suspended():
        with pytest.raises(RuntimeError):
            torch.device("turbine:cpu")
        torch.testing.assert_close(torch.ones(2) + 1, torch.full((2,), 2.0))
    assert torch.device("turbine:cpu").type == "turbine"
    class PassThrough(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with PassThrough():  # another mode on top of turbine's: both left as they are
        with mode.suspended():
            assert torch.device("turbine:cpu").type == "turbine"
