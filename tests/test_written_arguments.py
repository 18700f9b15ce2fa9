"""Ops write their arguments as torch does: every op the test suite and the library models met
that writes an argument (in-place, ``out=``, ``Tensor(a!)``, batch norm's running statistics),
replayed from a recorded call (tests/written_calls.py) on turbine:cpu and on torch's CPU. Each
written argument, and each result, must match torch's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from written_calls import UNDECLARED, load, written_positions

import turbine
from checks import D

CALLS = load(str(Path(__file__).parent / "data" / "written_calls.pt"))

#: (recorded op, dtype of its first tensor): why IREE cannot run it, as docs/op-coverage.md
#: reports. These run through the fallback, under the host policy (torch's CUDA kernels lack
#: some of them, int64 addmm among them); any other fallback fails the test.
FALLBACK = {
    ("aten.addmm_.default", "torch.int64"): "IREE 3.13 compiles no int64 matmul",
    ("aten.pow_.Tensor", "torch.int64"): "IREE 3.13's integer pow with a tensor exponent is refused",
    ("aten.igamma_.default", "torch.float32"): "IREE 3.13 has no lowering of igamma",
    ("aten.special_airy_ai.out", "torch.float32"): "IREE 3.13 has no lowering of airy_ai",
}


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    ids = []
    for call in CALLS:
        seen[call.op] = seen.get(call.op, 0) + 1
        ids.append(f"{call.op}-{seen[call.op]}")
    return ids


def test_the_recording_covers_the_known_writers():
    """The recorded calls include the ops the models and optimizers depend on most."""
    ops = {call.op for call in CALLS}
    for op in ["aten.add_.Tensor", "aten.mul_.Tensor", "aten.addcdiv_.default", "aten.copy_.default"]:
        assert op in ops
    assert {str(op) for op in UNDECLARED} <= ops


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
@pytest.mark.parametrize("call", CALLS, ids=_ids())
def test_written_arguments_match_torch(call, stats):
    func = call.resolve()
    cpu_args, cpu_kwargs = call.arguments(lambda recorded: recorded.on_cpu())
    device_args, device_kwargs = call.arguments(lambda recorded: recorded.on_device(D))
    torch.manual_seed(0)  # random in-place ops draw torch's CPU numbers on both sides
    expected = func(*cpu_args, **cpu_kwargs)
    dtype = str(next(v for v in torch.utils._pytree.tree_flatten(cpu_args)[0] if isinstance(v, torch.Tensor)).dtype)
    known_fallback = (call.op, dtype) in FALLBACK
    # The whole check sits inside the policy: a failed compile in the background falls back when
    # the result is read.
    with turbine.fallback("host" if known_fallback else turbine.config.fallback):
        torch.manual_seed(0)
        result = func(*device_args, **device_kwargs)
        _compare(func, result, expected, cpu_args, cpu_kwargs, device_args, device_kwargs)
    assert known_fallback or not turbine.stats()["fallbacks"], f"{call.op} on {dtype} fell back: {turbine.stats()['fallbacks']}"


def _compare(func, result, expected, cpu_args, cpu_kwargs, device_args, device_kwargs) -> None:
    """Each written argument and each result of the op, on the device and on torch's CPU."""
    names = [a.name for a in func._schema.arguments]
    for position in written_positions(func):
        name = names[position]
        cpu_value = cpu_args[position] if position < len(cpu_args) else cpu_kwargs.get(name)
        device_value = device_args[position] if position < len(device_args) else device_kwargs.get(name)
        if isinstance(cpu_value, torch.Tensor):
            torch.testing.assert_close(device_value.cpu(), cpu_value, equal_nan=True, msg=lambda m: f"{name}: {m}")
    results = [r for r in torch.utils._pytree.tree_flatten(result)[0] if isinstance(r, torch.Tensor)]
    expected_results = [r for r in torch.utils._pytree.tree_flatten(expected)[0] if isinstance(r, torch.Tensor)]
    for actual, wanted in zip(results, expected_results):
        if wanted.numel() and actual.shape == wanted.shape:  # eval batch norm's saved statistics: see eager/ops/normalization.py
            torch.testing.assert_close(actual.cpu(), wanted, equal_nan=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.mul_(0.5),
        lambda t: t.mul_(torch.tensor(0.5)),
        lambda t: t.bool().mul_(2),
        lambda t: t.to(torch.uint8).mul_(0.5),
        lambda t: t.add_(0.5),
    ],
    ids=["long*=0.5", "long*=0-d 0.5", "bool*=2", "uint8*=0.5", "long+=0.5"],
)
def test_an_in_place_result_that_cannot_be_cast_back_raises_torchs_error(call):
    """torch refuses an in-place op whose result type does not fit the tensor; some of its meta
    rules (mul_'s) leave that to the kernel, and turbine truncated: arange(5).mul_(0.5) gave
    [0, 0, 1, 1, 2]."""
    x = torch.arange(5)
    with pytest.raises(RuntimeError) as expected:
        call(x.clone())
    with pytest.raises(RuntimeError, match=str(expected.value).replace("(", r"\(").replace(")", r"\)")):
        call(x.to(D))


def test_in_place_results_that_fit_are_written():
    x = torch.arange(5)
    for call in (lambda t: t.mul_(3), lambda t: t.lt_(2.5), lambda t: t.masked_fill_(t > 2, 0.5), lambda t: t.float().mul_(0.5).half()):
        torch.testing.assert_close(call(x.to(D)).cpu(), call(x.clone()))
