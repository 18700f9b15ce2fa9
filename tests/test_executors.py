"""Executors (eager/executors/): who runs an op, chosen by cost among those a policy allows."""

from __future__ import annotations

import types

import pytest
import torch

import turbine
from turbine.eager import executors, fallback
from turbine.eager.dispatch import plans
from turbine.eager.kernel_plan import KernelPlan
from turbine.eager.plans import FallbackPlan
from checks import D

aten = torch.ops.aten


def test_each_policy_chooses_the_cheapest_executor_that_can_run_the_op():
    device = turbine.device(D)
    assert fallback.choose(aten.special_airy_ai.default, device, "device") is executors.TORCH
    assert fallback.choose(aten.special_airy_ai.default, device, "host") is executors.HOST
    assert fallback.choose(aten.special_airy_ai.default, device, "error") is None
    # torch runs on no vulkan device: the device policy takes host copies there.
    vulkan = types.SimpleNamespace(kind="vulkan")
    assert executors.TORCH.cost(aten.special_airy_ai.default, vulkan) is None
    assert fallback.choose(aten.special_airy_ai.default, vulkan, "device") is executors.HOST


def test_plans_hold_the_executor_that_runs_them(stats):
    x = torch.rand(3, 61, device=D)
    (torch.tanh(x) + 1).cpu()
    kernel_plans = [p for p in plans().values() if isinstance(p, KernelPlan) and p.func in (aten.tanh.default, aten.add.Tensor)]
    assert kernel_plans and all(p.executor is executors.IREE for p in kernel_plans)
    torch.special.airy_ai(x).cpu()  # no lowering: its plan falls back
    # Its kernel plan, whose compile failed (or a fallback plan, where the compile ran in the foreground).
    fallen = [p for p in plans().values() if isinstance(p, (KernelPlan, FallbackPlan)) and p.func is aten.special_airy_ai.default]
    assert fallen and fallen[0].executor is executors.TORCH
    with turbine.fallback("host"):
        assert fallen[0].executor is executors.HOST
    assert stats()["executors"]["iree"] == stats()["dispatches"] > 0


def test_an_executor_that_cannot_run_a_call_says_so():
    with pytest.raises(NotImplementedError, match="iree executor runs calls through its plans"):
        executors.IREE.run(aten.add.Tensor, (), {}, None)
    assert "IREE" in repr(executors.IREE)

