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

    __slots__ = ("key", "tensors", "scalars", "numbers", "device", "foreign")

    def __init__(self) -> None:
        self.key: list = []
        self.tensors: list[DeviceTensor] = []
        self.scalars: list = []
        self.numbers: list[bool] = []  # per runtime scalar: whether the traced op takes it as a number
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

    def scalar(self, value: Any, number: bool = False) -> None:
        """A runtime scalar; ``number``: the traced op takes it as a Python number (its exact value
        then crosses as a 64-bit number, as Python holds it)."""
        if isinstance(value, torch.Tensor):
            self.key.append(("scalar", value.dtype))
        else:
            self.key.append(("number" if number else "scalar", type(value)))
        self.scalars.append(value)
        self.numbers.append(number)

    def value(self, value: Any, kind: str, runtime: Any, number: bool = False) -> None:
        """One argument: ``runtime`` is its rule in ``OpSchema.runtime_scalars`` (False if none),
        ``number`` whether the traced op takes it as a number (``OpSchema.symbolic``)."""
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
            if kind == TENSOR or is_runtime(runtime, value):
                self.scalar(value, number=number and kind != TENSOR)
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


def is_runtime(rule: Any, value: Any) -> bool:
    """Whether a number in a Scalar slot is a runtime input, by its rule in
    ``OpSchema.runtime_scalars`` (False when it has none)."""
    return rule is True or (rule is not False and not rule(value))


def walk(func: Any, schema: OpSchema, args: tuple, kwargs: dict) -> Leaves:
    """Collect an op call's leaves; raises torch's mixed-device error for non-scalar CPU tensors."""
    leaves = Leaves()
    key = leaves.key
    key.append(func)
    kinds = schema.kinds
    runtime = schema.runtime_scalars
    symbolic = schema.symbolic
    names = schema.names
    for i, value in enumerate(args):
        if type(value) is DeviceTensor:  # the common case, checked first
            leaves.tensor(value)
        else:
            leaves.value(value, kinds[i], runtime.get(names[i], False), names[i] in symbolic)
    if kwargs:
        for name, value in kwargs.items():
            key.append(name)
            leaves.value(value, schema.kind_by_name.get(name, CONST), runtime.get(name, False), name in symbolic)
    if leaves.foreign is not None and leaves.device is not None:
        raise _devices_error(leaves.device, leaves.foreign)
    return leaves


def walk_tensors(func: Any, args: tuple) -> Leaves | None:
    """``walk`` for the commonest call, positional DeviceTensors on one device and nothing else
    (``add(x, y)``, ``mm``, ``relu``): the same leaves and key, in a loop of a few steps. None for
    any other call, which ``walk`` takes (and a mix of devices, whose error ``walk`` raises)."""
    device = None
    key: list = [func]
    for value in args:
        if type(value) is not DeviceTensor:
            return None
        storage_device = value._storage.device
        if device is None:
            device = storage_device
        elif storage_device is not device:
            return None
        key.append(value._key)
    leaves = Leaves()
    leaves.key = key
    leaves.tensors = list(args)
    leaves.device = device
    return leaves


def rebuild(
    schema: OpSchema,
    args: tuple,
    kwargs: dict,
    tensor_for: Callable[[Any], Any],
    scalar_for: Callable[[Any], Any],
) -> tuple[list, dict]:
    """The call's arguments with each tensor leaf and runtime scalar replaced, in walk order."""

    runtime = schema.runtime_scalars

    def one(value: Any, kind: str, rule: Any) -> Any:
        if isinstance(value, DeviceTensor):
            return tensor_for(value)
        if kind == CONST or value is None:
            return value
        if kind == TENSOR_LIST:
            return [one(item, TENSOR, True) for item in value]
        if type(value) in _NUMBERS:
            return scalar_for(value) if (kind == TENSOR or is_runtime(rule, value)) else value
        if isinstance(value, torch.Tensor):
            return scalar_for(value)
        return value

    new_args = [one(v, schema.kinds[i], runtime.get(schema.names[i], False)) for i, v in enumerate(args)]
    new_kwargs = {
        name: one(v, schema.kind_by_name.get(name, CONST), runtime.get(name, False)) for name, v in kwargs.items()
    }
    return new_args, new_kwargs
