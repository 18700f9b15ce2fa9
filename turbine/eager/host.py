"""Running an op with torch's own kernels on torch tensors standing in for its device tensors.

Two kinds of stand-in use this: host copies (``run_on_host``: random ops, so seeds give torch's
CPU numbers, and the ``host`` fallback), and tensors sharing the device memory through DLPack
(the ``device`` fallback, eager/fallback.py). Either way, arguments the op writes are updated by
writing new buffers into their storages, so turbine's buffers stay immutable and views see it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from turbine.device import Device
from turbine.eager.tensor import DeviceTensor, non_overlapping
from turbine.eager.transfer import to_device
from turbine.eager.views import to_host, write, write_resized
from turbine.errors import UnsupportedLayoutError


def raised_by_torch(error: BaseException) -> bool:
    """Whether torch's kernel itself raised ``error`` on the call's arguments (rather than turbine
    on the way to it or back): the call's own error, as torch would give it."""
    return getattr(error, "_turbine_raised_by_torch", False)


def device_of(args: tuple, kwargs: dict) -> Device | None:
    """The device of the first device tensor among an op's arguments."""
    for value in tree_flatten((args, kwargs))[0]:
        if isinstance(value, DeviceTensor):
            return value._storage.device
    return None


def device_tensors(args: tuple, kwargs: dict) -> list[DeviceTensor]:
    """Every device tensor among an op's arguments."""
    return [value for value in tree_flatten((args, kwargs))[0] if isinstance(value, DeviceTensor)]


def written_arguments(func: Any, args: tuple, kwargs: dict) -> list[DeviceTensor]:
    """The device tensors in the argument slots the op's schema marks as written (``a!``)."""
    found = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = kwargs.get(argument.name) if argument.kwarg_only or position >= len(args) else args[position]
        found += [v for v in tree_flatten(value)[0] if isinstance(v, DeviceTensor)]
    return found


def run_with_torch(
    func: Any,
    args: tuple,
    kwargs: dict,
    stand_in: Callable[[DeviceTensor, bool], torch.Tensor],
    bring_back: Callable[[torch.Tensor], DeviceTensor],
    torch_device: torch.device,
) -> Any:
    """``func`` on stand-ins of its device tensors; results and written arguments come back.

    ``stand_in(tensor, written)`` gives the torch tensor to run on (a private one when the op
    writes it); ``bring_back`` turns a torch result into a DeviceTensor; turbine device arguments
    become ``torch_device``.
    """
    written = {id(v) for v in written_arguments(func, args, kwargs)}
    originals: dict[int, DeviceTensor] = {}

    def down(value: Any) -> Any:
        if isinstance(value, DeviceTensor):
            torch_tensor = stand_in(value, id(value) in written)
            originals[id(torch_tensor)] = value
            return torch_tensor
        if isinstance(value, torch.device) and value.type == "turbine":
            return torch_device
        return value

    torch_args, torch_kwargs = tree_map(down, (args, kwargs))
    try:
        result = func(*torch_args, **torch_kwargs)
    except Exception as error:
        error._turbine_raised_by_torch = True  # read by raised_by_torch
        raise
    for torch_tensor in tree_flatten((torch_args, torch_kwargs))[0]:
        target = originals.get(id(torch_tensor))
        if target is not None and id(target) in written:
            if torch_tensor.shape != target.shape:
                write_resized(target, bring_back(torch_tensor))  # torch resized it (out=, resize_)
            else:
                write(target, bring_back(torch_tensor))

    def up(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                raise UnsupportedLayoutError(func, value.layout)
            target = originals.get(id(value))
            return target if target is not None else bring_back(value)
        return value

    return tree_map(up, result)


def run_on_host(func: Any, args: tuple, kwargs: dict, device: Device) -> Any:
    """``func`` with torch's CPU kernels on host copies (every byte moved is a counted transfer)."""
    return run_with_torch(
        func,
        args,
        kwargs,
        lambda tensor, written: host_copy(tensor),
        lambda result: to_device(result.cpu(), device),
        torch.device("cpu"),
    )


def host_copy(tensor: DeviceTensor) -> torch.Tensor:
    """A host copy of ``tensor`` with its strides, where no two of its elements share memory:
    torch's kernels follow a tensor's memory order (a random op on a transposed view draws its
    numbers in that order, ``rand_like`` keeps it), so a seed gives torch's CPU numbers."""
    values = to_host(tensor)
    if tensor._dense or not non_overlapping(tuple(tensor.shape), tuple(tensor.stride())):
        return values
    copy = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype)
    return copy.copy_(values)

