"""Long runs hold (issue 20, item 7): a hundred thousand ops in a loop keep turbine's buffer
count, its device memory and the process's memory flat, and device memory goes back when the
tensors over it die. Counters, not times."""

from __future__ import annotations

import gc

import pytest
import torch

import turbine
from checks import D


def _rss_bytes() -> int:
    """The process's resident memory, from /proc (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def _live() -> tuple[int, int]:
    stats = turbine.memory_stats(D)
    return stats["allocation.all.current"], stats["allocated_bytes.all.current"]


@pytest.mark.slow
def test_a_hundred_thousand_ops_keep_memory_flat():
    x = torch.randn(16, 16, device=D)
    index = torch.tensor([3, 1], device=D)

    def steps(count: int) -> torch.Tensor:
        y = x
        for _ in range(count):  # five ops a step: elementwise, an index check and its gather, in place
            y = torch.tanh(y * 0.5 + x)
            y[index] = y[index] * 0.5
        return y

    steps(200)
    turbine.synchronize(D)
    gc.collect()
    buffers, held = _live()
    rss = _rss_bytes()
    for _ in range(10):
        last = steps(2000)
        turbine.synchronize(D)
    gc.collect()
    assert torch.isfinite(last.cpu()).all()
    del last
    gc.collect()
    after_buffers, after_held = _live()
    assert after_buffers <= buffers + 16, (buffers, after_buffers)
    assert after_held <= held + 64 * 1024, (held, after_held)
    assert _rss_bytes() - rss < 64 * 2**20, "the process grew by more than 64 MiB over 100,000 ops"


def test_device_memory_goes_back_when_tensors_die():
    gc.collect()
    turbine.synchronize(D)  # lets go of memory an earlier test's dead buffers kept for torch's reads (device/retired.py)
    _, before = _live()
    big = [torch.ones(256, 1024, device=D) * i for i in range(4)]  # 1 MiB each
    turbine.synchronize(D)
    assert _live()[1] - before >= 4 * 2**20
    del big
    gc.collect()
    assert _live()[1] - before < 2**20


def test_an_op_that_failed_keeps_no_tensor_alive():
    """A failure kept for later calls (the plan's) holds no traceback, so not the call's tensors."""
    gc.collect()
    _, before = _live()
    big = torch.ones(512, 512, device=D)
    with pytest.raises(Exception, match="to_sparse|sparse|Sparse"):
        big.to_sparse()
    del big
    gc.collect()
    assert _live()[1] - before < 2**20
