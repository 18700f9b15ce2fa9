"""Recording and replaying calls of ops that write their arguments.

tests/test_written_arguments.py replays, on turbine:cpu and on torch's CPU, calls recorded from
the test suite and the library models: every op turbine met whose schema marks an argument as
written (in-place ops, ``out=``, ``Tensor(a!)`` arguments) or that writes one without saying so
(``native_batch_norm``'s running statistics). To record them again after the suite grows:

    TURBINE_RECORD_WRITES=tests/data/written_calls.pt python -m pytest -q

While recording, each such call (the first ``PER_OP`` per op and argument dtypes, small ones)
is kept with its arguments copied to the host before the op ran; a turbine tensor keeps its
whole storage and its view geometry, so a write through a view replays as one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from turbine.eager.schema import schema_of
from turbine.eager.tensor import DeviceTensor
from turbine.eager.views import to_host

aten = torch.ops.aten

#: Ops that write arguments their schema does not mark as written, by the positions they write.
UNDECLARED = {aten.native_batch_norm.default: (3, 4)}
PER_OP = 2
MAX_ELEMENTS = 4096


def written_positions(func: torch._ops.OpOverload) -> tuple[int, ...]:
    """Positions (in schema order) of the arguments ``func`` writes."""
    return UNDECLARED.get(func) or schema_of(func).written


@dataclasses.dataclass
class Recorded:
    """A turbine tensor as it was before the call: its storage's values and its view of them."""

    storage: torch.Tensor
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def on_cpu(self) -> torch.Tensor:
        return self.storage.clone().as_strided(self.size, self.stride, self.offset)

    def on_device(self, device: str) -> torch.Tensor:
        base = self.storage.to(device)
        if (self.size, self.offset) == (tuple(self.storage.shape), 0) and self.stride == tuple(base.stride()):
            return base
        return base.as_strided(self.size, self.stride, self.offset)


@dataclasses.dataclass
class Call:
    op: str  # "aten.add_.Tensor"
    args: tuple
    kwargs: dict

    def resolve(self) -> torch._ops.OpOverload:
        _, packet, overload = self.op.split(".")
        return getattr(getattr(aten, packet), overload)

    def arguments(self, tensor: Callable[[Recorded], torch.Tensor]) -> tuple[list, dict]:
        """The call's arguments with each recorded tensor made by ``tensor``."""
        make = lambda value: tensor(value) if isinstance(value, Recorded) else value  # noqa: E731
        return tree_map(make, list(self.args)), tree_map(make, dict(self.kwargs))


def _record(value: Any) -> Any:
    if isinstance(value, DeviceTensor):
        storage = to_host(DeviceTensor(value._storage, (value._storage.numel,)))
        return Recorded(storage, tuple(value.shape), tuple(value.stride()), value.storage_offset())
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


def _elements(args: tuple, kwargs: dict) -> int:
    return sum(v._storage.numel for v in tree_flatten((args, kwargs))[0] if isinstance(v, DeviceTensor))


def _dtypes(args: tuple, kwargs: dict) -> tuple:
    return tuple(str(v.dtype) for v in tree_flatten((args, kwargs))[0] if isinstance(v, torch.Tensor))


class Recorder:
    """Wraps turbine's dispatch to keep the calls of writing ops (see the module docstring)."""

    def __init__(self) -> None:
        self.calls: dict[tuple, Call] = {}
        self.per_op: dict[str, int] = {}

    def wrap(self, run: Callable) -> Callable:
        def recording_run(func: Any, args: tuple, kwargs: dict) -> Any:
            if isinstance(func, torch._ops.OpOverload) and written_positions(func):
                self.consider(func, args, kwargs)
            return run(func, args, kwargs)

        return recording_run

    def consider(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
        key = (str(func), _dtypes(args, kwargs))
        if key in self.calls or _elements(args, kwargs) > MAX_ELEMENTS or self.per_op.get(str(func), 0) >= PER_OP:
            return
        try:
            recorded = Call(str(func), tree_map(_record, tuple(args)), tree_map(_record, dict(kwargs)))
        except Exception:  # an argument that cannot be read (a failed launch): not a call to keep
            return
        self.calls[key] = recorded
        self.per_op[str(func)] = self.per_op.get(str(func), 0) + 1

    def save(self, path: str) -> None:
        torch.save(sorted(self.calls.values(), key=lambda call: call.op), path)


def load(path: str) -> list[Call]:
    return torch.load(path, weights_only=False)
