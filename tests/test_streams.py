"""Streams and events (issue 19, item 2): work on a stream runs in order, and an event orders
work across streams. The tests hold a kernel back behind a gate (a fence the host signals), so
whether later work waited for it is seen without timing anything."""

from __future__ import annotations

import pytest
import torch

import turbine
from turbine.device import Buffer
from turbine.eager.tensor import wrap
from checks import D


@pytest.fixture(autouse=True)
def _static_and_compiled():
    """Static kernels (a dynamic one waits for its inputs on the host, which a closed gate would
    block) compiled in the foreground, so that launches go out as they are issued."""
    with turbine.override(dynamic="off", background_compile=False):
        yield


_gates: list = []


@pytest.fixture(autouse=True)
def _gates_open_at_the_end():
    """A test that fails with a gate closed would leave a launch waiting forever (and every later
    synchronize with it): each gate is opened at teardown too."""
    yield
    while _gates:
        gate = _gates.pop()
        if not gate.wait(timeout=0):
            gate.signal()


#: The tests that hold a launch behind a gate. IREE 3.13's CUDA driver waits for a launch's
#: inputs on the host (its queue is synchronous, FACTS.md), so a gated launch would block the
#: thread that issues it: there every launch runs in issue order, whatever its stream, and
#: these tests, which show waiting and not waiting, cannot hold.
gates_need_a_queued_device = pytest.mark.skipif(
    D.startswith("turbine:cuda"), reason="IREE's CUDA driver waits for a launch's inputs on the host: a gate would block the test"
)


def gated(values: torch.Tensor):
    """A device tensor whose values are ready only when the returned gate is opened."""
    source = values.to(D)
    source.cpu()
    device = turbine.device(D)
    gate = device.new_fence()
    _gates.append(gate)
    buffer = source._storage.buffer
    held = Buffer(device, buffer.hal, gate, buffer.nbytes)
    return wrap(held, source.dtype, tuple(source.shape)), gate


def ready(tensor: torch.Tensor) -> bool:
    fence = tensor._storage.buffer.ready
    return fence is None or bool(fence.wait(timeout=0))


def warm(*tensors: torch.Tensor) -> None:
    """Compile the kernels the tests launch, outside the gates."""
    for t in tensors:
        (t.to(D) * 2 + 1).cpu()


@gates_need_a_queued_device
def test_an_event_orders_another_streams_work_after_it():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    warm(a, b)
    held, gate = gated(a)
    first, second = turbine.Stream(), turbine.Stream()
    with turbine.stream(first):
        slow = held * 2  # waits at the gate
        event = turbine.Event()
        event.record(first)
    with turbine.stream(second):
        second.wait_event(event)
        fast = b.to(D) + 1  # reads nothing of the first stream's: only the event orders it
    assert not ready(fast) and not event.query() and not second.query()
    gate.signal()
    torch.testing.assert_close(fast.cpu(), b + 1)
    torch.testing.assert_close(slow.cpu(), a * 2)
    assert event.query() and second.query()


@gates_need_a_queued_device
def test_without_the_event_the_other_stream_does_not_wait():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    warm(a, b)
    held, gate = gated(a)
    first, second = turbine.Stream(), turbine.Stream()
    with turbine.stream(first):
        slow = held * 2
    with turbine.stream(second):
        fast = b.to(D) + 1
    torch.testing.assert_close(fast.cpu(), b + 1)  # done while the first stream still waits
    assert not ready(slow) and not first.query()
    gate.signal()
    torch.testing.assert_close(slow.cpu(), a * 2)


@gates_need_a_queued_device
def test_work_on_one_stream_runs_in_issue_order():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    warm(a, b)
    held, gate = gated(a)
    side = turbine.Stream()
    with turbine.stream(side):
        slow = held * 2
        later = b.to(D) + 1  # no data from `slow`, yet after it on the stream
    assert turbine.current_stream() is turbine.default_stream()
    assert not ready(later)
    gate.signal()
    side.synchronize()
    assert ready(slow) and ready(later)
    torch.testing.assert_close(later.cpu(), b + 1)


@gates_need_a_queued_device
def test_an_event_on_the_default_stream_waits_for_all_launched_work():
    a = torch.randn(4, 4)
    warm(a)
    held, gate = gated(a)
    slow = held * 2
    event = turbine.Event()
    event.record()
    assert not event.query()
    gate.signal()
    event.synchronize()
    assert event.query() and ready(slow)


def test_streams_and_events_give_torchs_results_on_every_device():
    """Work split over two streams and joined by an event reads what it should (on a GPU too,
    where IREE runs every launch in issue order)."""
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    first, second = turbine.Stream(), turbine.Stream()
    with turbine.stream(first):
        x = a.to(D) @ b.to(D)
        done = turbine.Event()
        done.record(first)
    with turbine.stream(second):
        second.wait_event(done)
        y = x * 2 + 1
    second.synchronize()
    assert done.query() and second.query()
    torch.testing.assert_close(y.cpu(), (a @ b) * 2 + 1, rtol=1e-4, atol=1e-4)


def test_timing_events_measure_the_work_between_them():
    x = torch.randn(256, 256).to(D)
    (x @ x).cpu()
    start, end = turbine.Event(enable_timing=True), turbine.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        x = x @ x / 256
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        turbine.Event().elapsed_time(end)
    with pytest.raises(ValueError, match="between processes"):
        turbine.Event(interprocess=True)


def test_torch_turbine_offers_the_same_names():
    assert torch.turbine.Stream is turbine.Stream and torch.turbine.Event is turbine.Event
    s = torch.turbine.Stream(D)
    with torch.turbine.stream(s):
        assert torch.turbine.current_stream(D) is s
    assert torch.turbine.current_stream(D) is torch.turbine.default_stream(D)
