"""The runtime object (eager/runtime.py): state a test can replace, and per-thread fallback policies."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.testing import assert_close

import turbine
from turbine.eager import runtime
from checks import D


def test_a_replaced_runtime_starts_empty_and_the_old_one_comes_back():
    a = torch.randn(5, 7)
    x = a.to(D)
    assert_close((x * 2.5).cpu(), a * 2.5)
    old = runtime.state
    planned = len(old.plans)
    assert planned > 0 and old.device(x.turbine_device.index).scalar_views
    with runtime.replaced() as fresh:
        assert runtime.state is fresh and not fresh.plans and not fresh.device(x.turbine_device.index).scalar_views
        assert_close((x * 2.5).cpu(), a * 2.5)  # plans again, from the kernel cache
        assert fresh.plans
    assert runtime.state is old and len(old.plans) == planned


def test_the_fallback_policy_is_per_thread():
    """One thread's ``turbine.fallback("error")`` leaves another thread's ops falling back."""
    x = torch.rand(4, device=D)
    entered, done = threading.Event(), threading.Event()
    seen = {}

    def strict() -> None:
        with turbine.fallback("error"):
            entered.set()
            seen["strict"] = runtime.state.fallback_policy
            done.wait(timeout=60)

    thread = threading.Thread(target=strict)
    thread.start()
    try:
        assert entered.wait(timeout=60)
        assert runtime.state.fallback_policy == "device"
        assert_close(torch.special.airy_ai(x).cpu(), torch.special.airy_ai(x.cpu()))  # falls back here
    finally:
        done.set()
        thread.join()
    assert seen["strict"] == "error"


def test_policies_nest_and_unwind_on_errors():
    with turbine.fallback("host"):
        with pytest.raises(RuntimeError):
            with turbine.fallback("error"):
                assert runtime.state.fallback_policy == "error"
                raise RuntimeError("leave the block")
        assert runtime.state.fallback_policy == "host"
    assert runtime.state.fallback_policy == turbine.config.fallback
