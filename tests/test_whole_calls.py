"""Whole calls (eager/whole_calls.py): a torch call whose every op runs on the vendor executor
runs whole on torch's kernels over the device memory, past turbine's dispatch.

Each test learns a call (its first run with its plans decided: a new plan's first call times
the executors, unless the kernel cache kept the choice), then shows what the later calls do:
whole where they may (the dispatcher is not entered, torch's numbers, the vendor counted), the
usual way wherever skipping dispatch would skip something: autograd, an index check, a random
draw on the host, a write, a view, a profile, the executors switch.
"""

from __future__ import annotations

import pytest
import torch

import turbine
from turbine.config import override
from turbine.eager import runtime, whole_calls
from turbine.eager.executors import vendor as vendor_executor
from turbine.eager.tensor import DeviceTensor
from checks import D, winner


@pytest.fixture
def vendor(monkeypatch):
    """The vendor executor on (on the CPU devices too) and chosen by every timed plan, kernels
    compiled in the foreground; plans and whole calls learnt afresh."""
    winner("vendor", monkeypatch)
    turbine.eager.dispatch.clear_plans()
    with override(executors="all", background_compile=False):
        yield
    turbine.eager.dispatch.clear_plans()


@pytest.fixture
def dispatched(monkeypatch):
    """The aten ops that reached turbine's dispatch (names), as a list that tests read and clear."""
    seen: list[str] = []
    real = DeviceTensor.dispatcher

    def counting(func, args, kwargs):
        seen.append(str(func))
        return real(func, args, kwargs)

    monkeypatch.setattr(DeviceTensor, "dispatcher", counting)
    return seen


def verdict(func) -> list:
    """The whole-call verdicts kept for ``func`` (False: the usual way; else (device, ops))."""
    return [v for k, v in runtime.state.whole_calls.items() if k[0] is func]


def test_a_chain_of_adds_runs_whole_after_its_first_call(vendor, dispatched, stats):
    a, b = torch.randn(64, 32), torch.randn(64, 32)
    x, y = a.to(D), b.to(D)
    z = x + y  # the plan: built, both executors timed (or the choice taken from the kernel cache)
    z = z + y  # learnt (if not by the first call): one add, on the vendor
    assert 1 <= len(dispatched) <= 2 and set(dispatched) == {"aten.add.Tensor"}
    dispatched.clear()
    turbine.reset_stats()
    for _ in range(4):
        z = z + y
    assert dispatched == []  # whole: torch's add on the device memory, no dispatch
    torch.testing.assert_close(z.cpu(), a + 6 * b)
    assert isinstance(z, DeviceTensor) and z.device == x.device and z.is_contiguous()
    assert stats()["executors"]["vendor"] == 4
    assert verdict(torch._C.TensorBase.add) == [(turbine.device(D), 1)]


def test_a_call_of_several_ops_runs_whole_when_each_is_a_view_or_the_vendors(vendor, dispatched, stats):
    """``F.linear`` is a transpose (a view) and an addmm; its result is new memory."""
    a, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    x, wd, bd = a.to(D), w.to(D), b.to(D)
    with torch.no_grad():
        results = [torch.nn.functional.linear(x, wd, bd) for _ in range(2)]
        assert "aten.addmm.default" in dispatched
        dispatched.clear()
        turbine.reset_stats()
        results.append(torch.nn.functional.linear(x, wd, bd))
    assert dispatched == []
    for result in results:
        torch.testing.assert_close(result.cpu(), torch.nn.functional.linear(a, w, b))
    assert stats()["executors"]["vendor"] == 1


def test_numbers_are_part_of_the_key_and_promote_as_torch(vendor, dispatched):
    a = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    x = a.to(D)
    for _ in range(2):
        x * 2, x * 2.5, x * True  # the plans built and timed, the calls learnt
    dispatched.clear()
    results = [x * 2, x * 3, x * 3, x * 2.5, x * True, x * -1, x * -1]
    expected = [a * 2, a * 3, a * 3, a * 2.5, a * True, a * -1, a * -1]
    for result, want in zip(results, expected):
        assert result.dtype == want.dtype
        torch.testing.assert_close(result.cpu(), want)
    assert dispatched.count("aten.mul.Tensor") == 2  # one learning call for each new number (3, -1)


def test_autograd_keeps_the_usual_way_and_no_grad_runs_whole(vendor, dispatched):
    a, b = torch.randn(5, 5), torch.randn(5, 5)
    x, y = a.to(D).requires_grad_(), b.to(D)
    for _ in range(2):
        (x * y).sum().backward()
    assert dispatched.count("aten.mul.Tensor") >= 2  # every forward call dispatched, recorded for backward
    torch.testing.assert_close(x.grad.cpu(), 2 * b)
    dispatched.clear()
    with torch.no_grad():
        results = [x * y for _ in range(3)]
    assert dispatched == ["aten.mul.Tensor"]  # learnt once (the plan was decided), then whole
    for result in results:
        assert not result.requires_grad
        torch.testing.assert_close(result.cpu(), a * b)


def test_an_index_checked_op_keeps_the_usual_way_and_its_error(vendor, dispatched):
    """``index_select``'s index is checked on the device (eager/ops/bounds.py): a whole call on
    torch's kernel would skip the check (on a GPU, a device-side assert that loses the context)."""
    a = torch.randn(6, 3)
    x = a.to(D)
    good = torch.tensor([0, 5, 2]).to(D)
    for _ in range(2):
        torch.testing.assert_close(torch.index_select(x, 0, good).cpu(), a[[0, 5, 2]])
    assert verdict(torch.index_select) == [False]
    bad = torch.tensor([0, 6, 2]).to(D)
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.index_select(x, 0, bad).cpu()


def test_a_random_op_keeps_the_host_draw_so_seeds_give_torchs_numbers(vendor):
    a = torch.randn(32, 32)
    x = a.to(D)
    results = []
    for _ in range(3):
        torch.manual_seed(7)
        results.append(torch.nn.functional.dropout(x, 0.5).cpu())
    torch.manual_seed(7)
    expected = torch.nn.functional.dropout(a, 0.5)
    for result in results:
        torch.testing.assert_close(result, expected)
    assert verdict(torch.nn.functional.dropout) == [False]


def test_writes_and_views_keep_the_usual_way(vendor, dispatched):
    base = torch.zeros(4, 4).to(D)
    row = base[1]
    for _ in range(3):
        row.add_(1)  # in place: the new buffer is installed in the storage every view shares
    torch.testing.assert_close(base.cpu()[1], torch.full((4,), 3.0))
    for _ in range(2):
        t = base.t()  # a view: it must alias its base
    base.add_(1)
    torch.testing.assert_close(t.cpu(), base.cpu().t())
    assert verdict(torch._C.TensorBase.add_) and not any(verdict(torch._C.TensorBase.add_))
    assert verdict(torch._C.TensorBase.t) == [False]


def test_a_profile_sees_every_op(vendor):
    x = torch.randn(8, 8).to(D)
    for _ in range(3):
        x + x  # timed, learnt, whole
    with turbine.profile() as profile:
        for _ in range(3):
            x + x
    (row,) = [r for r in profile.sorted_rows() if r.op == "aten.add.Tensor"]
    assert row.calls == 3


def test_the_executors_switch_turns_whole_calls_off(vendor, dispatched):
    x = torch.randn(8, 8).to(D)
    for _ in range(3):
        x - x
    dispatched.clear()
    with override(executors="iree"):
        x - x
    assert dispatched == ["aten.sub.Tensor"]


def test_a_failure_of_torchs_call_falls_back_to_the_usual_way(vendor, dispatched, monkeypatch):
    a = torch.randn(8, 8)
    x = a.to(D)
    x * x  # timed
    x * x  # learnt
    real = vendor_executor.call_torch
    failures = []

    def failing(function, args, kwargs, device, what):
        if function is what:  # the whole call (an op's own call passes its C++ callable)
            failures.append(what)
            raise RuntimeError("injected")
        return real(function, args, kwargs, device, what)

    monkeypatch.setattr(vendor_executor, "call_torch", failing)
    dispatched.clear()
    result = x * x
    assert failures and dispatched == ["aten.mul.Tensor"]
    torch.testing.assert_close(result.cpu(), a * a)
    assert verdict(torch._C.TensorBase.mul) == [False]  # the key keeps the usual way from now on


def test_devices_are_checked_as_torch_does(vendor):
    x = torch.randn(3).to(D)
    for _ in range(3):
        x + x
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.randn(3).to("turbine:cpu1" if D == "turbine:cpu" else "turbine:cpu")


def test_sizes_and_other_questions_are_not_keyed(vendor):
    x = torch.randn(3, 4).to(D)
    for _ in range(2):
        assert x.size(1) == 4 and x.dim() == 2
    assert torch._C.TensorBase.size in runtime.state.not_whole
    assert not verdict(torch._C.TensorBase.size)


def test_without_the_vendor_calls_take_the_usual_way_unkeyed(dispatched):
    turbine.eager.dispatch.clear_plans()
    x = torch.randn(8, 8).to(D)
    for _ in range(3):
        x + x
    assert dispatched.count("aten.add.Tensor") == 3
    assert not runtime.state.whole_calls


def test_a_torch_call_made_while_a_call_is_learnt_takes_the_usual_way(vendor, dispatched, monkeypatch):
    """turbine's own code may call torch on DeviceTensors while an op runs (a handler): while a
    call is being learnt, such calls are neither learnt nor run whole on their own, so the outer
    call's notes see their ops."""
    x = torch.randn(8, 8).to(D)
    for _ in range(3):
        x * x
    assert verdict(torch._C.TensorBase.mul)  # x * x alone: learnt, whole
    inner: list = []
    real_note = whole_calls.note_plan

    def note_plan(plan):
        if not inner:  # once, inside the outer call being learnt
            inner.append(None)
            before = len(dispatched)
            x * x
            inner.append(dispatched[before:])
        real_note(plan)

    monkeypatch.setattr(whole_calls, "note_plan", note_plan)
    torch.sub(x, x)
    assert inner[1] == ["aten.mul.Tensor"]  # dispatched: the usual way, not whole
