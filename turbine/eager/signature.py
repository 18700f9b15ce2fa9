"""Walking an op's arguments: the plan-cache key, the device tensors and the runtime scalars.

``walk`` runs on every op, so it is written for speed: one pass, no pytree. ``rebuild`` walks
the same way and puts kernel inputs (or meta tensors) back where the leaves were.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.device import Device
from turbine.eager.schema import CONST, TENSOR, TENSOR_LIST, OpSchema
from turbine.eager.tensor import DeviceTensor

_NUMBERS = (int, float, bool)


def _devices_error(first: Device, other: str) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {first.name} and {other}!"
    )


def _freeze(value: Any) -> Any:
    """A hashable, plain form of a compiled-in argument."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    return value


class Leaves:
    """What one walk collects: the key parts, device tensors, runtime scalars and their device."""

    __slots__ = ("key", "tensors", "scalars", "device", "foreign")

    def __init__(self) -> None:
        self.key: list = []
        self.tensors: list[DeviceTensor] = []
        self.scalars: list = []
        self.device: Device | None = None
        self.foreign: str | None = None  # the first non-scalar tensor that is not on a turbine device

    def tensor(self, value: DeviceTensor) -> None:
        device = value._storage.device
        if self.device is None:
            self.device = device
        elif device is not self.device:
            raise _devices_error(self.device, device.name)
        self.key.append(value._key)
        self.tensors.append(value)

    def scalar(self, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.key.append(("scalar", value.dtype))
        else:
            self.key.append(("scalar", type(value)))
        self.scalars.append(value)

    def value(self, value: Any, kind: str, runtime: bool) -> None:
        cls = type(value)
        if cls is DeviceTensor:
            self.tensor(value)
        elif kind == CONST or value is None:
            self.key.append(_freeze(value))
        elif kind == TENSOR_LIST:
            self.key.append(len(value))
            for item in value:
                self.value(item, TENSOR, True)
        elif cls in _NUMBERS:
            if kind == TENSOR or runtime:
                self.scalar(value)
            else:
                self.key.append((cls, value))
        elif isinstance(value, DeviceTensor):  # a subclass of DeviceTensor (nn.Parameter-style)
            self.tensor(value)
        elif isinstance(value, torch.Tensor):
            if value.dim() != 0 or value.device.type != "cpu":
                self.foreign = self.foreign or str(value.device)
                self.key.append(None)
            else:
                self.scalar(value)
        else:
            self.key.append(_freeze(value))


def walk(func: Any, schema: OpSchema, args: tuple, kwargs: dict) -> Leaves:
    """Collect an op call's leaves; raises torch's mixed-device error for non-scalar CPU tensors."""
    leaves = Leaves()
    key = leaves.key
    key.append(func)
    kinds = schema.kinds
    runtime = schema.runtime_scalars
    names = schema.names
    for i, value in enumerate(args):
        if type(value) is DeviceTensor:  # the common case, checked first
            leaves.tensor(value)
        else:
            leaves.value(value, kinds[i], names[i] in runtime)
    if kwargs:
        for name, value in kwargs.items():
            key.append(name)
            leaves.value(value, schema.kind_by_name.get(name, CONST), name in runtime)
    if leaves.foreign is not None and leaves.device is not None:
        raise _devices_error(leaves.device, leaves.foreign)
    return leaves


def rebuild(
    schema: OpSchema,
    args: tuple,
    kwargs: dict,
    tensor_for: Callable[[Any], Any],
    scalar_for: Callable[[Any], Any],
) -> tuple[list, dict]:
    """The call's arguments with each tensor leaf and runtime scalar replaced, in walk order."""

    def one(value: Any, kind: str, runtime: bool) -> Any:
        if isinstance(value, DeviceTensor):
            return tensor_for(value)
        if kind == CONST or value is None:
            return value
        if kind == TENSOR_LIST:
            return [one(item, TENSOR, True) for item in value]
        if type(value) in _NUMBERS:
            return scalar_for(value) if (kind == TENSOR or runtime) else value
        if isinstance(value, torch.Tensor):
            return scalar_for(value)
        return value

    new_args = [one(v, schema.kinds[i], schema.names[i] in schema.runtime_scalars) for i, v in enumerate(args)]
    new_kwargs = {
        name: one(v, schema.kind_by_name.get(name, CONST), name in schema.runtime_scalars) for name, v in kwargs.items()
    }
    return new_args, new_kwargs
