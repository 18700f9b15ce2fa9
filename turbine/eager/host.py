"""Running an op with torch's CPU kernels on host copies of its device tensors.

turbine uses this where torch's own CPU semantics are the point: random ops draw from torch's
CPU generator, so ``torch.manual_seed`` gives the numbers torch on the CPU gives. Every byte it
moves is counted as a host transfer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from turbine.eager.tensor import DeviceTensor
from turbine.eager.transfer import to_device, to_host
from turbine.eager.views import write


def run_on_host(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func`` on CPU copies; results come back to the device, written-to tensors updated in place."""
    originals: dict[int, DeviceTensor] = {}
    device = None

    def down(value: Any) -> Any:
        nonlocal device
        if isinstance(value, DeviceTensor):
            device = value._storage.device
            host = to_host(value)
            originals[id(host)] = value
            return host
        return value

    host_args, host_kwargs = tree_map(down, (args, kwargs))
    result = func(*host_args, **host_kwargs)
    # Write back every argument the op changed in place.
    for host in tree_flatten((host_args, host_kwargs))[0]:
        if isinstance(host, torch.Tensor) and id(host) in originals and func._schema.is_mutable:
            target = originals[id(host)]
            if _was_written(func, host, host_args, host_kwargs):
                write(target, to_device(host, device))

    def up(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) in originals:
                return originals[id(value)]
            return to_device(value, device)
        return value

    return tree_map(up, result)


def _was_written(func: Any, host: torch.Tensor, args: list, kwargs: dict) -> bool:
    """Whether the schema marks the argument holding ``host`` as written (``a!``)."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = kwargs.get(argument.name) if argument.kwarg_only or position >= len(args) else args[position]
        if value is host:
            return True
    return False
