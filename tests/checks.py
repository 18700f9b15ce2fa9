"""What every test file shares: the device under test and the comparison with torch.

``TURBINE_TEST_DEVICE`` picks the device (``turbine:cpu`` unless set; the GPU run sets
``turbine:cuda0``). ``check`` runs a function on CPU tensors and on their turbine copies and
compares every result, and asserts which executor ran the turbine side, so that a broken
lowering cannot pass by falling back to torch's kernel.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

import turbine
from turbine.eager import timed_plan

#: The turbine device the tests run on.
D = os.environ.get("TURBINE_TEST_DEVICE", "turbine:cpu")

#: Executors ``check`` knows: IREE kernels only; or at least one op on torch's kernel or the host.
EXECUTORS = ("iree", "fallback", "host")


def to_device(value: Any) -> Any:
    """A tensor's copy on D; anything else as it is."""
    return value.to(D) if isinstance(value, torch.Tensor) else value


def _results(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _executors_used() -> tuple[dict, dict]:
    """Copies of the fallback and host-op counters (stats() hands out live dicts)."""
    stats = turbine.stats()
    return dict(stats["fallbacks"]), dict(stats["host_ops"])


def check(fn: Callable, *inputs: Any, executor: str = "iree", **tolerance: Any) -> None:
    """``fn`` on turbine copies of ``inputs`` matches ``fn`` on the inputs (torch on the CPU), and
    ran on ``executor``: ``"iree"`` (no op fell back or ran on the host), ``"fallback"`` (an op
    fell back or ran on the host) or ``"host"`` (an op ran on the host by design, none fell back)."""
    assert executor in EXECUTORS, f"executor must be one of {EXECUTORS}"
    before = _executors_used()
    actual = _results(fn(*[to_device(t) for t in inputs]))
    for a in actual:
        if isinstance(a, torch.Tensor):
            assert isinstance(a, turbine.DeviceTensor), f"a result is {type(a).__name__}, not a turbine tensor"
    # Read before counting: a launch whose kernel compiled in the background runs (or falls back) when read.
    actual = [a.cpu() if isinstance(a, torch.Tensor) else a for a in actual]
    after = _executors_used()
    if executor == "iree":
        assert after == before, f"expected IREE kernels only; fallbacks and host ops went from {before} to {after}"
    elif executor == "host":
        assert after[0] == before[0] and after[1] != before[1], f"expected host ops only; fallbacks and host ops went from {before} to {after}"
    else:
        assert after != before, "expected a fallback, but IREE ran every op"
    for a, e in zip(actual, _results(fn(*inputs)), strict=True):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, **tolerance)
        else:
            assert a == e


def winner(name: str, monkeypatch: Any) -> None:
    """Make the timed plans' timing find ``name`` (``"vendor"`` or ``"iree"``) faster: they time
    IREE's kernel, then the vendor's (eager/timed_plan.py)."""
    calls = []

    def best(run: Callable[[], Any]) -> tuple[float, Any]:
        calls.append(run)
        timing_iree = len(calls) % 2 == 1
        return (1.0 if (name == "iree") == timing_iree else 2.0), run()

    monkeypatch.setattr(timed_plan, "_best", best)
