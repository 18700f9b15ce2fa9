"""Two devices of one kind at once (issue 21): ``turbine:cpu`` and ``turbine:cpu1`` everywhere, and
``turbine:cuda0`` with ``turbine:cuda1`` where IREE sees two GPUs (skipped, with the reason, where
it sees fewer). Each device has its own queue and kernels; ops that mix them raise torch's error;
``.to()`` between them copies after the source's last write; a device guard is per thread; a
model split across the two trains as on the CPU; streams on both keep their order."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

import turbine
from turbine.config import override


def _gpus() -> int:
    return sum(name.startswith("turbine:cuda") for name in turbine.devices())


PAIRS = [
    pytest.param(("turbine:cpu", "turbine:cpu1"), id="two-cpus"),
    pytest.param(
        ("turbine:cuda0", "turbine:cuda1"),
        id="two-gpus",
        marks=pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs that IREE sees (the two-GPU machine)"),
    ),
]


@pytest.fixture(params=PAIRS)
def pair(request):
    return request.param


def test_each_device_has_its_own_queue_and_shares_compiled_kernels(pair, stats):
    first, second = (turbine.device(name) for name in pair)
    assert first is not second and first.hal is not second.hal and first.index != second.index
    x = torch.randn(5, 7)
    with override(background_compile=False):
        torch.testing.assert_close(torch.sinh(x.to(pair[0])).cpu(), torch.sinh(x))
        compiled = stats()["kernels_compiled"]
        torch.testing.assert_close(torch.sinh(x.to(pair[1])).cpu(), torch.sinh(x))
    assert stats()["kernels_compiled"] == compiled  # one target, one compile: the second device loads it
    assert first.outstanding() == [] or all(f.wait(timeout=0) for f in first.outstanding())


def test_ops_that_mix_the_devices_raise_torchs_error(pair):
    a, b = torch.ones(3, device=pair[0]), torch.ones(3, device=pair[1])
    with pytest.raises(RuntimeError, match=f"Expected all tensors to be on the same device, but found at least two devices, {pair[0]} and"):
        a + b


def test_a_copy_between_the_devices_comes_after_the_sources_last_write(pair, stats):
    source = torch.arange(6.0, device=pair[0])
    source[2:4].mul_(10)  # an in-place write through a view, still in flight
    with override(background_compile=True):
        source.add_(torch.sinh(torch.ones(6, device=pair[0])))  # perhaps still compiling
    turbine.reset_stats()
    moved = source.to(pair[1])
    assert moved.device == torch.ones(1, device=pair[1]).device
    expected = torch.arange(6.0)
    expected[2:4] *= 10
    expected += torch.sinh(torch.ones(6))
    torch.testing.assert_close(moved.cpu(), expected)
    assert stats()["host_transfers"] >= 2  # through the host: counted (down, up, and the read here)


def test_where_torch_runs_both_devices_the_copy_stays_off_the_host(pair, stats):
    """With the vendor executor on both (GPUs by default; here forced on), torch copies device to
    device (a peer copy between GPUs), after the source's last write."""
    with override(executors="all" if pair[0] == "turbine:cpu" else "auto"):
        source = torch.arange(6.0, device=pair[0])
        source[1:3].mul_(5)
        turbine.reset_stats()
        moved = source.to(pair[1])
        assert stats()["host_transfers"] == 0 and stats()["device_copies"] == 1
        expected = torch.arange(6.0)
        expected[1:3] *= 5
        torch.testing.assert_close((moved * 2).cpu(), expected * 2)  # a kernel on the target reads it
        torch.testing.assert_close(moved.cpu(), expected)


def test_a_device_guard_is_per_thread(pair):
    seen: dict[str, torch.device] = {}
    inside = threading.Barrier(2)

    def use(name: str) -> None:
        with turbine.device(name):
            inside.wait()  # both threads are inside their own guard now
            seen[name] = torch.ones(1, device="turbine").device
            inside.wait()
        seen[name + " after"] = torch.ones(1, device="turbine").device

    threads = [threading.Thread(target=use, args=(name,)) for name in pair]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert seen[pair[0]] == torch.ones(1, device=pair[0]).device
    assert seen[pair[1]] == torch.ones(1, device=pair[1]).device
    outside = torch.device("turbine", turbine.current_device().index)  # neither guard reached here
    assert seen[pair[0] + " after"] == seen[pair[1] + " after"] == outside


def test_a_model_split_across_the_devices_trains_like_the_cpu(pair):
    torch.manual_seed(0)
    first_half = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh())
    second_half = torch.nn.Sequential(torch.nn.Linear(16, 3))
    ours = (copy.deepcopy(first_half).to(pair[0]), copy.deepcopy(second_half).to(pair[1]))
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    theirs_opt = torch.optim.SGD([*first_half.parameters(), *second_half.parameters()], lr=0.1)
    ours_opt = torch.optim.SGD([*ours[0].parameters(), *ours[1].parameters()], lr=0.1)
    losses, expected = [], []
    for _ in range(20):
        theirs_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(second_half(first_half(x)), y)
        loss.backward()
        theirs_opt.step()
        expected.append(loss.item())
        ours_opt.zero_grad()
        middle = ours[0](x.to(pair[0])).to(pair[1])  # autograd carries the gradient back across
        loss = torch.nn.functional.mse_loss(ours[1](middle), y.to(pair[1]))
        loss.backward()
        ours_opt.step()
        losses.append(loss.detach())
    assert [float(v) for v in losses] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    for p, q in zip([*first_half.parameters(), *second_half.parameters()], [*ours[0].parameters(), *ours[1].parameters()]):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-4, atol=1e-5)


def test_interleaved_streams_on_both_devices_keep_their_order(pair):
    """Work on a stream of each device, each joined to the other's by an event, in turns: every
    step reads what the other device's stream wrote just before."""
    streams = [turbine.Stream(name) for name in pair]
    value = torch.ones(4, 4)
    expected = value.clone()
    x = value.to(pair[0])
    for step in range(6):
        side = step % 2
        stream = streams[side]
        with turbine.stream(stream):
            x = x.to(pair[side]) * 2 + step
            done = turbine.Event()
            done.record(stream)
        streams[1 - side].wait_event(done)
        expected = expected * 2 + step
    turbine.synchronize(pair[0])
    turbine.synchronize(pair[1])
    torch.testing.assert_close(x.cpu(), expected)


def test_copy_into_a_tensor_of_the_other_device_stays_off_the_host_where_torch_runs_both(pair, stats):
    """``dst.copy_(src)`` across the two devices takes the same device-to-device copy as ``.to()``."""
    with override(executors="all" if pair[0] == "turbine:cpu" else "auto"):
        source = torch.randn(3, 4).to(pair[0])
        destination = torch.zeros(3, 4, device=pair[1])
        turbine.reset_stats()
        destination.copy_(source)
        assert stats()["host_transfers"] == 0 and stats()["device_copies"] == 1
        torch.testing.assert_close(destination.cpu(), source.cpu())
    with override(executors="iree"):  # no torch kernels: through the host, counted
        source = torch.randn(3, 4).to(pair[0])
        turbine.reset_stats()
        destination.copy_(source)
        assert stats()["host_transfers"] >= 2 and stats()["device_copies"] == 0
        torch.testing.assert_close(destination.cpu(), source.cpu())
