"""The vendor executor (eager/executors/vendor.py) and the timed plan that chooses it (eager/timed_plan.py).

On the CPU devices the vendor is torch's CPU kernel, under ``TURBINE_EXECUTORS=all``; on a GPU
(``TURBINE_TEST_DEVICE=turbine:cuda0``) torch's CUDA kernels under the default ``auto``. The
timings that choose are replaced where a test needs a given winner.
"""

from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch

import turbine
from turbine.config import override
from turbine.eager import executors, planning, timed_plan
from turbine.eager.dispatch import plans
from turbine.eager.timed_plan import TimedPlan
from turbine.errors import CompileError
from checks import D, winner
from conftest import forget_memory

aten = torch.ops.aten


@pytest.fixture
def vendor_on():
    with override(executors="all"):
        yield


def timed_plans() -> list[TimedPlan]:
    return [p for p in plans().values() if isinstance(p, TimedPlan)]


def settle_compiles() -> None:
    for plan in timed_plans():
        if plan.kernel_plan is not None:
            plan.kernel_plan.await_kernel()


def test_the_switch_says_where_the_vendor_competes():
    device = turbine.device(D)
    with override(executors="iree"):
        assert executors.VENDOR.cost(aten.mm.default, device) is None
    with override(executors="all"):
        assert executors.VENDOR.cost(aten.mm.default, device) == 1.0
        assert executors.VENDOR.claims(aten.mm.default, device, [torch.float32, torch.float32])
        assert executors.VENDOR.cost(aten.add.Tensor, device) == 1.0  # every op IREE runs as a kernel competes
        assert executors.VENDOR.cost(aten.mm.default, types.SimpleNamespace(kind="vulkan")) is None
    with override(executors="auto"):
        expected = 1.0 if device.kind == "cuda" else None  # on GPUs alone by default
        assert executors.VENDOR.cost(aten.mm.default, device) == expected
    with override(executors="cublas"):
        with pytest.raises(ValueError, match="TURBINE_EXECUTORS .* choose one of auto, iree, all"):
            executors.VENDOR.cost(aten.mm.default, device)


@pytest.mark.parametrize("compiled", [True, False], ids=["timed", "while-compiling"])
def test_a_call_torch_has_no_kernel_for_stays_on_iree(compiled, monkeypatch, vendor_on, fresh_cache, stats):
    """cuBLAS has no integer matmul, torch CUDA no uint16 add: where the vendor's kernel raises,
    whether timing or standing in for a compiling kernel, IREE's kernel keeps the signature."""
    real = executors.VENDOR.run

    def no_kernel(func, args, kwargs, device):
        if func is aten.mul.Tensor:
            raise RuntimeError('"mul_cuda" not implemented for \'UInt16\' (injected)')
        return real(func, args, kwargs, device)

    monkeypatch.setattr(executors.VENDOR, "run", no_kernel)
    a, b = torch.randn(5, 6), torch.randn(5, 6)
    with override(background_compile=not compiled):
        results = [(a.to(D) * b.to(D)).cpu() for _ in range(3)]
    for result in results:
        torch.testing.assert_close(result, a * b)
    (plan,) = [p for p in timed_plans() if p.func is aten.mul.Tensor]
    assert plan.chosen == "iree" and plan.executor is executors.IREE
    assert stats()["executors"].get("vendor", 0) == 0 and not stats()["fallbacks"]
    settle_compiles()
    (kept,) = [c for c in fresh_cache.choices() if c["op"].startswith("aten.mul.Tensor")]
    assert kept["executor"] == "iree" and "torch's kernel failed" in kept["why"]


@pytest.mark.parametrize("faster", ["vendor", "iree"])
def test_a_signature_runs_on_the_executor_timing_finds_faster(faster, monkeypatch, vendor_on, fresh_cache, stats):
    a, b = torch.randn(48, 40), torch.randn(40, 24)
    x, y = a.to(D), b.to(D)
    winner(faster, monkeypatch)
    with override(background_compile=False):
        first = (x @ y).cpu()  # builds the plan, compiles the kernel, times both
    results = [(x @ y).cpu() for _ in range(3)]
    for result in [first, *results]:
        torch.testing.assert_close(result, a @ b)
    (plan,) = timed_plans()
    assert plan.chosen == faster and plan.executor is {"vendor": executors.VENDOR, "iree": executors.IREE}[faster]
    assert stats()["executor_timings"] == 1
    counts = stats()["executors"]
    if faster == "vendor":
        assert counts.get("vendor", 0) == 3  # the calls after the one that timed (and counts as IREE's)
    else:
        assert counts.get("vendor", 0) == 0 and counts["iree"] == 4
    (kept,) = fresh_cache.choices()
    assert kept["executor"] == faster and kept["op"] == "aten.mm.default(float32[48, 40], float32[40, 24])"


def test_a_later_process_takes_the_choice_from_disk_without_timing(monkeypatch, vendor_on, fresh_cache, stats):
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    winner("vendor", monkeypatch)
    with override(background_compile=False):
        (a.to(D) @ b.to(D)).cpu()
    forget_memory()

    def no_timing(run):
        raise AssertionError("a kept choice was timed again")

    monkeypatch.setattr(timed_plan, "_best", no_timing)
    turbine.reset_stats()
    torch.testing.assert_close((a.to(D) @ b.to(D)).cpu(), a @ b)
    assert stats()["executors"].get("vendor") == 1
    assert stats()["kernels_compiled"] == 0


def test_iree_is_timed_with_its_hand_overs_to_torch(monkeypatch, vendor_on, fresh_cache):
    """IREE's timed calls include making their results torch tensors (as the vendor's next call
    would), and a choice kept from another way of timing is timed again."""
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    timed = []

    def best(run):
        result = run()
        timed.append(all(t._storage.buffer.shared is not None for t in [result] if isinstance(t, turbine.DeviceTensor)))
        return float(len(timed)), result

    monkeypatch.setattr(timed_plan, "_best", best)
    with override(background_compile=False):
        torch.testing.assert_close((a.to(D) @ b.to(D)).cpu(), a @ b)
    assert timed == [True, True]  # IREE's result was handed to torch (the vendor's is torch's)
    (kept,) = fresh_cache.choices()
    assert kept["timing"] == timed_plan.TIMING
    digest = kept.pop("digest")
    fresh_cache.save_choice(digest, {**kept, "timing": timed_plan.TIMING - 1})
    forget_memory()
    with override(background_compile=False):
        (a.to(D) @ b.to(D)).cpu()
    assert len(timed) == 4, "a choice timed the old way was kept"


def test_a_copy_of_a_strided_view_competes_where_the_vendor_runs(monkeypatch, vendor_on, fresh_cache, stats):
    """A dense copy of a view that is not dense needs a gather: where the vendor runs, it competes
    for it (attention's transposes were gathered by IREE between two torch kernels on the H200,
    a hand-over each way); a dense input's copy still shares its buffer, with no kernel."""
    a = torch.randn(8, 6)
    winner("vendor", monkeypatch)
    view = a.to(D).t()
    with override(background_compile=False):
        torch.testing.assert_close(view.contiguous().cpu(), a.t().contiguous())
    turbine.reset_stats()
    torch.testing.assert_close(view.contiguous().cpu(), a.t().contiguous())
    assert stats()["executors"].get("vendor") == 1 and not stats()["executors"].get("iree")
    dense = a.to(D)
    turbine.reset_stats()
    assert dense.clone()._storage.buffer is dense._storage.buffer and not any(stats()["executors"].values())
    with override(executors="iree"):
        forget_memory()
        torch.testing.assert_close(view.contiguous().cpu(), a.t().contiguous())  # IREE's gather
        assert not stats()["executors"].get("vendor")


def test_calls_run_on_the_vendor_while_the_kernel_compiles(vendor_on, fresh_cache, stats):
    a, b = torch.randn(24, 56), torch.randn(56, 8)
    result = a.to(D) @ b.to(D)  # the kernel has just started compiling (hundreds of ms)
    assert stats()["deferred_launches"] == 0 and stats()["executors"].get("vendor") == 1
    torch.testing.assert_close(result.cpu(), a @ b)


def test_a_kernel_that_does_not_compile_leaves_the_call_to_the_vendor(monkeypatch, vendor_on, fresh_cache, stats):
    def fails(*args, **kwargs):
        raise CompileError("IREE could not lower it (injected)")

    monkeypatch.setattr(planning, "kernel_plan", fails)
    a, b = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the vendor is a choice, not a fallback: no warning
        result = torch.bmm(a.to(D), b.to(D))
    torch.testing.assert_close(result.cpu(), torch.bmm(a, b))
    assert stats()["executors"].get("vendor") == 1 and not stats()["fallbacks"]
    (plan,) = timed_plans()
    with override(executors="iree"):  # IREE alone: the fallback policy runs what IREE cannot
        assert plan.executor is executors.TORCH
        with pytest.warns(turbine.TurbineFallbackWarning):
            torch.bmm(a.to(D), b.to(D)).cpu()


def test_executors_iree_turns_the_vendor_off_for_built_plans_too(monkeypatch, vendor_on, fresh_cache, stats):
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    winner("vendor", monkeypatch)
    with override(background_compile=False):
        (a.to(D) @ b.to(D)).cpu()
    assert timed_plans()[0].chosen == "vendor"
    turbine.reset_stats()
    with override(executors="iree"):
        torch.testing.assert_close((a.to(D) @ b.to(D)).cpu(), a @ b)
        assert not timed_plans()  # the plans built with the vendor in are gone
    assert stats()["executors"].get("vendor", 0) == 0 and stats()["executors"]["iree"] == 1
    turbine.reset_stats()
    (a.to(D) @ b.to(D)).cpu()  # the vendor let in again: its choice, kept on disk, holds
    assert stats()["executors"].get("vendor") == 1 and stats()["executor_timings"] == 0


def test_letting_the_vendor_in_replans_what_iree_alone_planned(monkeypatch, fresh_cache, stats):
    a, b = torch.randn(16, 24), torch.randn(24, 8)
    winner("vendor", monkeypatch)
    with override(executors="iree", background_compile=False):
        torch.testing.assert_close((a.to(D) @ b.to(D)).cpu(), a @ b)
        assert not timed_plans()
    with override(executors="all", background_compile=False):
        (a.to(D) @ b.to(D)).cpu()  # timed now: IREE's kernel against the vendor's
        turbine.reset_stats()
        torch.testing.assert_close((a.to(D) @ b.to(D)).cpu(), a @ b)
        (plan,) = timed_plans()
        assert plan.chosen == "vendor" and stats()["executors"].get("vendor") == 1


def test_training_through_vendor_kernels_matches_torch(monkeypatch, vendor_on, fresh_cache):
    """A convolution and a linear layer forward and backward, with the vendor winning every timing."""
    winner("vendor", monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5))
    ours = copy.deepcopy(model).to(D)
    x = torch.randn(4, 3, 6, 6)
    for _ in range(3):
        for m, inp in ((model, x), (ours, x.to(D))):
            m.zero_grad()
            m(inp).square().mean().backward()
    for p, q in zip(model.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5)
    settle_compiles()
    chosen = {str(p.func).split(".")[1]: p.chosen for p in timed_plans()}
    assert {"convolution", "convolution_backward", "addmm", "mm"} <= set(chosen), chosen


def test_a_foreach_op_runs_whole_on_the_vendor(vendor_on, stats):
    """One torch multi-tensor kernel for the list (one vendor op), in place or not."""
    tensors = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2)]
    ours = [t.to(D) for t in tensors]
    torch._foreach_mul_(ours, 2.0)
    summed = torch._foreach_add(ours, ours, alpha=0.5)
    expected = [t * 2 for t in tensors]
    for a, e in zip(ours, expected):
        torch.testing.assert_close(a.cpu(), e)
    for a, e in zip(summed, expected):
        torch.testing.assert_close(a.cpu(), e * 1.5)
    assert stats()["executors"].get("vendor") == 2 and stats()["executors"].get("iree", 0) == 0


def test_an_in_place_foreach_op_on_the_vendor_writes_views_and_shared_storages(vendor_on, stats):
    """Dense targets take torch's results as their buffers; a view's result is written into its
    base; a tensor that shares a target's storage sees the new values."""
    base = torch.randn(4, 6)
    ours_base = base.to(D)
    column, alias = ours_base[:, 1], ours_base.view(24)  # a strided view; a second view of the whole storage
    dense = torch.randn(3).to(D)
    expected_dense = dense.cpu() * 3
    torch._foreach_mul_([ours_base, dense], 3.0)
    torch._foreach_add_([column, dense], 1.0)
    expected = base * 3
    expected[:, 1] += 1
    torch.testing.assert_close(ours_base.cpu(), expected)
    torch.testing.assert_close(alias.cpu(), expected.reshape(24))
    torch.testing.assert_close(dense.cpu(), expected_dense + 1)
    # both ops whole on the vendor; the column's result scattered into its base by IREE's kernel
    assert stats()["executors"].get("vendor") == 2 and stats()["executors"].get("iree", 0) == 1


def test_a_vendor_call_leaves_no_reference_cycle(monkeypatch, vendor_on, fresh_cache, stats):
    """A call's inputs are let go when the call returns, not when Python's cycle collector next
    runs: a cycle per call kept every input's device memory alive until then. (Background
    compiles of earlier tests may leave cycles of torch's own meanwhile, fake tensors included:
    only turbine's objects, tensors and functions are counted.)"""
    import gc

    winner("vendor", monkeypatch)
    x, y = torch.randn(16, 16).to(D), torch.randn(16, 16).to(D)

    def calls() -> torch.Tensor:
        z = torch.add(x, y)
        return torch._foreach_add([z, x], [y, y])[0]

    with override(background_compile=False):
        for _ in range(2):  # timed, plans built
            calls().cpu()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage to look at
    try:
        for _ in range(20):
            z = calls()
        gc.collect()
        ours = [o for o in gc.garbage if (getattr(o, "__module__", None) or type(o).__module__ or "").startswith("turbine")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    torch.testing.assert_close(z.cpu(), (x.cpu() + y.cpu()) + y.cpu())
    assert not ours, f"left in reference cycles: {sorted({type(o).__name__ for o in ours})}"
    assert stats()["executors"].get("vendor", 0) >= 40


def _attention_case(**options):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    ours = [t.detach().to(D).requires_grad_() for t in (q, k, v)]
    theirs_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **options)
    dev_options = {n: (o.to(D) if isinstance(o, torch.Tensor) else o) for n, o in options.items()}
    our_out = torch.nn.functional.scaled_dot_product_attention(*ours, **dev_options)
    theirs_out.square().sum().backward()
    our_out.square().sum().backward()
    torch.testing.assert_close(our_out.cpu(), theirs_out, rtol=1e-4, atol=1e-5)
    for a, b in zip(ours, (q, k, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"is_causal": True}, {"scale": 0.3}, {"attn_mask": "bool"}], ids=["plain", "causal", "scale", "mask"])
def test_attention_runs_whole_on_the_vendor_forward_and_backward(options, vendor_on, stats):
    if options.get("attn_mask") == "bool":
        options = {"attn_mask": torch.rand(16, 16) > 0.3}
    _attention_case(**options)
    assert stats()["executors"].get("vendor", 0) >= 2  # the forward call and its backward (and the loss's ops)
    assert not any("softmax" in op for op in stats()["fallbacks"])
    assert not [key for key in plans() if "softmax" in str(key[0]) or "bmm" in str(key[0])]  # not torch's math


def test_attention_is_torchs_math_on_iree_kernels_with_the_vendor_off(stats):
    _attention_case(is_causal=True)
    assert stats()["executors"].get("vendor", 0) == 0 and stats()["executors"]["iree"] > 0


def test_attention_under_inference_mode_runs_on_the_vendor(vendor_on, stats):
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    with torch.inference_mode():
        out = torch.nn.functional.scaled_dot_product_attention(q.to(D), k.to(D), v.to(D))
    torch.testing.assert_close(out.cpu(), torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert stats()["executors"].get("vendor") == 1


def test_cache_list_shows_each_choice(monkeypatch, vendor_on, fresh_cache, capsys):
    from turbine.__main__ import main

    a = torch.randn(8, 8)
    winner("iree", monkeypatch)
    with override(background_compile=False):
        (a.to(D) @ a.to(D)).cpu()
    assert main(["cache", "list", "--dir", str(fresh_cache.root)]) == 0
    listing = capsys.readouterr().out
    assert "chosen" in listing and "aten.mm.default(float32[8, 8], float32[8, 8]): iree (timed" in listing
    assert main(["cache", "info", "--dir", str(fresh_cache.root)]) == 0
    assert "1 executor choices" in capsys.readouterr().out


def test_timing_runs_bursts_of_calls_and_waits_once_per_burst(monkeypatch):
    """An executor whose kernels return before they finish is charged its host cost per call, as a
    chain of ops pays it, not one latency and a wait per call."""
    calls, waits = [], []
    result = torch.ones(2).to(D)
    monkeypatch.setattr(type(result._storage.buffer), "wait", lambda self: waits.append(len(calls)))

    def run():
        calls.append(1)
        return [result]

    best, last = timed_plan._best(run)
    assert len(calls) == (timed_plan.RUNS + 1) * timed_plan.BURST and last == [result]
    assert waits == [timed_plan.BURST * k for k in range(1, timed_plan.RUNS + 2)]  # once after each burst
    assert best > 0


def test_a_compile_left_running_by_a_vendor_run_can_be_waited_for(vendor_on, fresh_cache, stats):
    """The first call runs on the vendor while IREE's kernel compiles in the background; the
    compile outlives the op, and ``wait_for_compiles`` returns once it is done (the test suite's
    fixtures wait there, so that it does not count in the next test's stats)."""
    from turbine.kernels_cache import kernel_cache

    x = torch.randn(3, 5)
    with override(background_compile=True):
        before = stats()["kernels_compiled"]
        torch.testing.assert_close(torch.tanh(x.to(D)).cpu(), torch.tanh(x))
        assert kernel_cache.wait_for_compiles(timeout=300)
        assert stats()["kernels_compiled"] == before + 1
