"""Background compiles: ops whose kernel is compiling return at once and launch later, in order.

Each test uses shapes no other test uses, so that its kernels are new to the session's cache.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch.testing import assert_close

import turbine
from turbine.eager import deferred
from turbine.kernels_cache import tracing
from checks import D



def _on(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(D) for t in tensors]


def test_ops_return_before_their_kernels_compile(stats):
    a, b = torch.randn(5, 19), torch.randn(19, 3)
    x, w = _on(a, b)
    with turbine.override(dynamic="off"):  # a shape-generic kernel compiles in the foreground
        y = torch.tanh(x @ w) * 2.5
        z = torch.sigmoid(y).sum(dim=0)
    issued = stats()
    # Issuing took far less than one compile: the last op's kernel cannot be ready yet.
    assert issued["deferred_launches"] >= 3
    assert issued["kernels_compiled"] < 4
    assert_close(z.cpu(), torch.sigmoid(torch.tanh(a @ b) * 2.5).sum(dim=0))
    assert not deferred.waiting(z.turbine_device)  # reading z ran every launch before it


def test_later_in_place_ops_do_not_change_a_waiting_launch_input():
    a = torch.randn(6, 23)
    x = a.to(D)
    y = torch.cos(x) + 1.25  # waits for its kernels
    x.add_(100.0)  # swaps x's buffer; y must still read the old values
    x.mul_(2.0)
    assert_close(y.cpu(), torch.cos(a) + 1.25)
    assert_close(x.cpu(), (a + 100.0) * 2.0)


def test_pending_results_can_be_read_viewed_and_transposed():
    a = torch.randn(7, 29)
    x = a.to(D)
    y = torch.exp(x) / 3.0
    assert_close(y[2].cpu(), (torch.exp(a) / 3.0)[2])
    g = y.t() @ y  # a non-dense view of a pending result into a new kernel
    assert_close(g.cpu(), (torch.exp(a) / 3.0).t() @ (torch.exp(a) / 3.0), rtol=1e-4, atol=1e-3)
    assert y[0, 0].item() == pytest.approx(float(torch.exp(a[0, 0]) / 3.0), rel=1e-5)
    assert "turbine" in repr(torch.log1p(x.abs()))


def test_multi_output_ops_wait_too():
    a = torch.randn(9, 31)
    x = a.to(D)
    values, indices = torch.max(torch.sin(x), dim=1)
    top_v, top_i = torch.topk(x * 2.0, 4, dim=1)
    assert_close(values.cpu(), torch.max(torch.sin(a), dim=1).values)
    assert torch.equal(indices.cpu(), torch.max(torch.sin(a), dim=1).indices)
    assert_close(top_v.cpu(), torch.topk(a * 2.0, 4, dim=1).values)
    assert torch.equal(top_i.cpu(), torch.topk(a * 2.0, 4, dim=1).indices)


def test_gradients_through_waiting_launches():
    a, b = torch.randn(11, 17), torch.randn(17, 5)
    x = a.to(D).requires_grad_()
    w = b.to(D).requires_grad_()
    loss = (torch.tanh(x @ w) ** 2).mean()
    loss.backward()
    ra, rb = a.clone().requires_grad_(), b.clone().requires_grad_()
    (torch.tanh(ra @ rb) ** 2).mean().backward()
    assert_close(x.grad.cpu(), ra.grad)
    assert_close(w.grad.cpu(), rb.grad)


def test_a_failed_background_compile_runs_the_fallback(stats):
    a = torch.rand(13, 3) + 0.5
    x = a.to(D)
    y = torch.sqrt(x)  # compiles in the background
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", turbine.TurbineFallbackWarning)
        z = torch.special.airy_ai(y)  # IREE has no lowering: its compile fails in the background
        w = z * 2.0
        assert_close(w.cpu(), torch.special.airy_ai(torch.sqrt(a)) * 2.0)
        # Called again with nothing waiting: the plan knows its compile failed.
        assert_close(torch.special.airy_ai(x).cpu(), torch.special.airy_ai(a))
    assert stats()["fallbacks"].get("aten.special_airy_ai.default") == 2


def test_the_error_policy_fails_at_the_op_itself(stats):
    x = torch.rand(3, 41).to(D)
    with turbine.fallback("error"):
        y = torch.cos(x)
        with pytest.raises(turbine.UnsupportedOpError, match="airy_ai"):
            torch.special.airy_ai(y)
    assert stats()["deferred_launches"] == 0


def test_background_compile_can_be_turned_off(stats):
    a = torch.randn(4, 43)
    with turbine.override(background_compile=False):
        y = torch.atan(a.to(D)) - 0.5
        assert stats()["kernels_compiled"] == 2
    assert stats()["deferred_launches"] == 0
    assert_close(y.cpu(), torch.atan(a) - 0.5)


@pytest.mark.skipif(not D.startswith("turbine:cpu"), reason="IREE 3.13's CUDA driver loads modules only on the thread that opened the device")
def test_threads_asking_for_one_new_kernel_share_its_compile(stats):
    a = torch.randn(3, 47)
    x = a.to(D)
    results = [None] * 4

    def run(i: int) -> None:
        results[i] = torch.asinh(x).cpu()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    with turbine.override(background_compile=False):  # each thread compiles in the foreground
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert stats()["kernels_compiled"] == 1
    for result in results:
        assert_close(result, torch.asinh(a))


def test_a_launch_that_cannot_run_fails_its_dependents_not_unrelated_ops(monkeypatch):
    from turbine.kernels_cache import cache as cache_module

    compile_mlir = cache_module.compile_mlir

    issued = threading.Event()

    def broken_for_erf(text, target):
        if "torch.aten.erf " in text:
            issued.wait(timeout=60)  # fail once the ops below are queued, not before erf's call returns
            raise RuntimeError("compiler process lost")
        return compile_mlir(text, target)

    a = torch.randn(2, 53)
    x = a.to(D)
    monkeypatch.setattr(cache_module, "compile_mlir", broken_for_erf)
    y = torch.erf(x)  # its compile will raise
    z = y * 3.0  # depends on y
    w = torch.erfc(x)  # unrelated, issued after both
    issued.set()
    assert_close(w.cpu(), torch.erfc(a))
    with pytest.raises(RuntimeError, match="compiler process lost"):
        z.cpu()
    with pytest.raises(RuntimeError, match="compiler process lost"):
        y.cpu()
    monkeypatch.undo()
    # The op starts over on its next call (its plan forgot the stopped compile).
    assert_close(torch.erf(x).cpu(), torch.erf(a))


def test_a_stopped_compile_inside_a_relaid_plan_starts_over_on_the_next_call(monkeypatch):
    """A channels-last convolution's kernel plan sits inside a plan that copies its result into
    torch's layout (eager/relaid_plan.py); a compile stopped there made only the outer plan
    known to the plan cache, so the op raised the stopped compile's error on every later call."""
    from turbine.kernels_cache import cache as cache_module

    compile_mlir = cache_module.compile_mlir

    def lost_for_convolution(text, target):
        if "convolution" in text:
            raise RuntimeError("compiler process lost")
        return compile_mlir(text, target)

    a = torch.randn(2, 3, 11, 9).to(memory_format=torch.channels_last)
    w = torch.randn(5, 3, 3, 3)
    x, v = _on(a, w)
    expected = torch.nn.functional.conv2d(a, w)
    monkeypatch.setattr(cache_module, "compile_mlir", lost_for_convolution)
    with turbine.override(dynamic="off"), pytest.raises(RuntimeError, match="compiler process lost"):
        torch.nn.functional.conv2d(x, v).cpu()
    monkeypatch.undo()
    with turbine.override(dynamic="off"):
        y = torch.nn.functional.conv2d(x, v)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert_close(y.cpu(), expected)


def test_ops_a_queued_fallback_issues_run_before_the_launches_queued_after_it(monkeypatch, stats):
    """A queued launch whose compile failed runs the fallback policy. Should that fallback issue
    turbine ops, they run there and then; the launches queued after it wait (they may read its
    results, which it has not made yet)."""
    from turbine.eager import fallback

    run_fallback = fallback.run
    draining_seen = []

    def through_turbine_ops(func, args, kwargs, reason):
        if func is not torch.ops.aten.special_airy_ai.default:
            return run_fallback(func, args, kwargs, reason)
        draining_seen.append(deferred.draining())
        return args[0] * 2.0 + 1.0  # turbine ops, one of them with a new kernel

    monkeypatch.setattr(fallback, "run", through_turbine_ops)
    a = torch.rand(7, 59) + 0.5
    x = a.to(D)
    # Static kernels: a shape-generic one (for an op earlier tests ran at other sizes) compiles
    # in the foreground, and this test is about the launches queued behind a background compile.
    with turbine.override(dynamic="off"):
        y = torch.sqrt(x)  # compiles in the background
        z = torch.special.airy_ai(y)  # queued; its compile fails, so its launch runs the fallback
        w = z - y  # queued after it, reads z
    assert_close(w.cpu(), torch.sqrt(a) + 1.0)
    assert draining_seen and draining_seen[0]  # the fallback did run inside the queue
    assert stats()["deferred_launches"] >= 3


def _embedding_bag_inputs() -> list[torch.Tensor]:
    return [torch.randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4])]


@pytest.mark.parametrize(
    "call, inputs",
    [
        (lambda t: torch.ops.aten._embedding_bag(*t), _embedding_bag_inputs),
        (lambda t: torch.ops.aten._embedding_bag_forward_only(*t), _embedding_bag_inputs),
        (lambda t: [torch.ops.aten.multi_margin_loss(*t, 1, 1.0, None, 0)], lambda: [torch.randn(5), torch.tensor(2)]),
    ],
    ids=["embedding_bag", "embedding_bag_forward_only", "multi_margin_loss_of_one_sample"],
)
@pytest.mark.skipif(not D.startswith("turbine:cpu"), reason="torch's CUDA kernels give the shape rule's shapes")
def test_ops_whose_shape_rule_and_kernel_disagree_give_the_kernel_shapes(call, inputs):
    """torch's shape rule gives embedding_bag's offset2bag [N] where its CPU kernel gives [0]
    (and one sample's unreduced multi-class margin loss [1] where it gives []):
    the lowering that follows the rule is refused and torch's kernel runs, before any tensor is
    handed out. (Batch norm's eval-mode statistics take the rule's shapes: test_module_state.py.)"""
    values = inputs()
    expected = call([t.clone() for t in values])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", turbine.TurbineFallbackWarning)
        actual = call([t.to(D) for t in values])
        assert [tuple(a.shape) for a in actual] == [tuple(e.shape) for e in expected]
        for a, e in zip(actual, expected):
            assert_close(a.cpu(), e)


@pytest.mark.skipif(not D.startswith("turbine:cpu"), reason="two CPU devices stand in for two devices")
def test_each_device_has_its_own_queue_and_pending_tensors_move_between_them():
    a, b = torch.randn(3, 59), torch.randn(3, 59)
    x, y = a.to("turbine:cpu"), b.to("turbine:cpu1")
    p = torch.sinh(x) * 0.5  # waits on turbine:cpu
    q = torch.cosh(y) * 0.25  # waits on turbine:cpu1
    moved = p.to("turbine:cpu1")  # a pending tensor crosses devices
    assert_close((moved + q).cpu(), torch.sinh(a) * 0.5 + torch.cosh(b) * 0.25)
    assert not deferred.waiting(y.turbine_device)


def test_compile_threads_trace_ops_as_the_issuing_thread_does(stats):
    """A composite op must reach the decomposition table whole on a compile thread too: there
    isclose once came decomposed by torch (into an in-place op IREE cannot lower) and fell back."""
    a = torch.randn(3, 61)
    b = a + torch.randn(3, 61) * 1e-3
    x, y = _on(a, b)
    assert torch.allclose(x, y, rtol=0.1, atol=1e-2) == torch.allclose(a, b, rtol=0.1, atol=1e-2)
    assert not torch.allclose(x, y, rtol=0.0, atol=1e-9)
    assert "aten.isclose.default" not in stats()["fallbacks"]


def test_a_new_kernel_is_traced_by_the_thread_that_issued_its_op(monkeypatch):
    """A trace sets torch.fx's process-wide state (``nn.Module.__call__`` patched,
    ``is_fx_tracing()`` true). Traced on a compile thread, it showed to the user's code running
    meanwhile: a torch.compile'd model raised "Detected that you are using FX to symbolically
    trace a dynamo-optimized function" (on the GPU). Compile threads compile; they do not trace."""
    traced_by = []
    make_fx = tracing.make_fx

    def recording(*args, **kwargs):
        traced_by.append(threading.current_thread())
        return make_fx(*args, **kwargs)

    monkeypatch.setattr(tracing, "make_fx", recording)
    a = torch.randn(4, 67)
    y = torch.atan(a.to(D)) * 1.5
    assert_close(y.cpu(), torch.atan(a) * 1.5)
    assert traced_by and set(traced_by) == {threading.current_thread()}
