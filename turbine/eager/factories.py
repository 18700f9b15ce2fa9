"""Creating tensors on a turbine device from torch's factory functions (``torch.zeros(..., device=)``).

- Random factories run on torch's CPU generator and are uploaded, so a seed gives torch's numbers.
- Factories that copy host data (``torch.tensor``, ``as_tensor``) upload it.
- ``empty`` allocates; every other factory is a compiled kernel with no inputs, cached by its
  arguments, so ``torch.zeros(1000, 1000, device=...)`` moves no data from the host.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.device import NO_WAIT, Device
from turbine.eager import lowering, runtime
from turbine.eager.dtypes import check_dtype
from turbine.eager.scalars import number_dtype, scalar_view
from turbine.eager.tensor import DeviceTensor, empty, wrap
from turbine.eager.transfer import to_device
from turbine.kernels_cache import kernel_cache

RANDOM = {
    "rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson",
    "rand_like", "randn_like", "randint_like",
}
FROM_DATA = {"tensor", "as_tensor", "asarray", "from_numpy", "frombuffer"}
EMPTY = {"empty", "empty_strided", "empty_like"}
# ``*_like`` of a CPU tensor on a turbine device is the plain factory of that tensor's shape.
LIKE = {"zeros_like": torch.zeros, "ones_like": torch.ones, "full_like": torch.full, "empty_like": torch.empty}



def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple, torch.Size)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format, torch.device)):
        return str(value)
    return value


def create(func: Callable, args: tuple, kwargs: dict, device: Device) -> torch.Tensor:
    """Run a factory function for ``device``; honours ``requires_grad=``."""
    kwargs = dict(kwargs)
    kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", False)
    kwargs.pop("pin_memory", None)
    name = getattr(func, "__name__", "")
    if name in LIKE and args and isinstance(args[0], torch.Tensor) and not isinstance(args[0], DeviceTensor):
        like = args[0]
        kwargs.setdefault("dtype", like.dtype)
        kwargs.pop("memory_format", None)
        func, args = LIKE[name], (tuple(like.shape),) + tuple(args[1:])
        name = func.__name__
    if isinstance(args[0] if args else None, DeviceTensor):
        result = func(*args, device=torch.device("turbine", device.index), **kwargs)
    elif name in RANDOM or name in FROM_DATA:
        result = to_device(func(*args, device="cpu", **kwargs), device)
    elif name in EMPTY:
        meta = func(*args, device="meta", **kwargs)
        result = empty(tuple(meta.shape), meta.dtype, device)
    else:
        result = _run_factory_kernel(func, name, args, kwargs, device)
    if requires_grad:
        result.requires_grad_(True)
    return result


#: Factories whose fill value is a runtime input, by name: where it sits (position, keyword).
_RUNTIME_FILL = {"full": (1, "fill_value"), "scalar_tensor": (0, "s")}


def _runtime_fill(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict, int | float | None]:
    """The call with a numeric fill value taken out (None in its place), and that value; a bool
    or a non-number stays in the call (compiled in) and the value returned is None."""
    if name not in _RUNTIME_FILL:
        return args, kwargs, None
    position, keyword = _RUNTIME_FILL[name]
    value = args[position] if len(args) > position else kwargs.get(keyword)
    if type(value) not in (int, float):
        return args, kwargs, None
    if len(args) > position:
        return args[:position] + (None,) + args[position + 1 :], kwargs, value
    return args, {**kwargs, keyword: None}, value


def _run_factory_kernel(func: Callable, name: str, args: tuple, kwargs: dict, device: Device) -> DeviceTensor:
    """A factory as a kernel with no tensor inputs; ``full``'s fill value is a runtime input (so
    ``torch.full(shape, v)`` compiles once for every ``v``), the other arguments are compiled in."""
    call_args, call_kwargs, fill = _runtime_fill(name, args, kwargs)
    key = (name, _freeze(call_args), _freeze(sorted(call_kwargs.items())), type(fill), device.index)
    kernels = runtime.state.factory_kernels
    entry = kernels.get(key)
    if entry is None:
        meta = func(*args, device="meta", **kwargs)
        check_dtype(meta.dtype, f"the result of torch.{name}")
        sizes = tuple(meta.shape)
        if meta.numel() == 0:
            return empty(sizes, meta.dtype, device)  # no values to compute (see dispatch._zero_size)
        inputs = [] if fill is None else [((), number_dtype(fill))]
        kernel = kernel_cache.kernel(
            ("factory",) + key[:4],
            device,
            lambda: lowering.lower(_traced(func, call_args, {**call_kwargs, "dtype": meta.dtype}, name), inputs),
            f"torch.{name}{_freeze(call_args)}",
        )
        entry = kernels[key] = (kernel, sizes, meta.dtype)
    kernel, sizes, dtype = entry
    views = [] if fill is None else [scalar_view(device, fill, number_dtype(fill))]
    ((buffer, view),) = kernel.launch(views, NO_WAIT)
    return wrap(buffer, dtype, sizes, view)


def _traced(func: Callable, args: tuple, kwargs: dict, name: str) -> Callable[..., list[torch.Tensor]]:
    """What the factory's kernel computes: the call, with the runtime fill value (if any) read
    from the kernel's one 0-d input as a number."""

    def traced(*fill: torch.Tensor) -> list[torch.Tensor]:
        call_args, call_kwargs = args, kwargs
        if fill:
            position, keyword = _RUNTIME_FILL[name]
            value = fill[0].to(kwargs["dtype"]).item()  # converted in a kernel: see dispatch._as_numbers
            if len(args) > position:
                call_args = args[:position] + (value,) + args[position + 1 :]
            else:
                call_kwargs = {**kwargs, keyword: value}
        return [func(*call_args, device="cpu", **call_kwargs)]

    return traced
