"""Creating tensors on a turbine device from torch's factory functions (``torch.zeros(..., device=)``).

- Random factories run on torch's CPU generator and are uploaded, so a seed gives torch's numbers.
- Factories that copy host data (``torch.tensor``, ``as_tensor``) upload it.
- ``empty`` allocates; every other factory is a compiled kernel with no inputs, cached by its
  arguments, so ``torch.zeros(1000, 1000, device=...)`` moves no data from the host.
- ``full``, ``zeros``, ``ones`` and integer ``arange`` called at a second size go shape-generic
  (eager/dynamic.py's rule): one kernel per rank and dtype takes the sizes from a zero-element
  input of shape ``[*sizes, 0]``, and the fill value (``arange``'s start and step) as values.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from turbine.device import NO_WAIT, Device, sizes_carrier
from turbine.eager import dynamic, lowering, runtime
from turbine.eager.dtypes import check_dtype
from turbine.eager.dtypes import ELEMENT_TYPES, STORAGE_ONLY
from turbine.eager.scalars import check_fill_value, int_vector, number_dtype, scalar_view
from turbine.eager.tensor import DeviceTensor, empty, wrap
from turbine.eager.transfer import to_device
from turbine.errors import CompileError
from turbine.kernels_cache import kernel_cache
from turbine.kernels_cache.tracing import Dynamic

log = logging.getLogger("turbine")

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
    if name in _NO_BOOL and kwargs.get("dtype") is torch.bool:  # turbine's kernel would give values
        raise NotImplementedError(f"\"{name}_{device.kind}\" not implemented for 'Bool'")
    if name in ("zeros", "ones") and kwargs.get("dtype") is torch.uint8:
        # a uint8 constant does not compile (ops/corrections.py's _unsigned_filled): a full
        args, kwargs = (tuple(func(*args, device="meta", **kwargs).shape), int(name == "ones")), {"dtype": torch.uint8}
        func, name = torch.full, "full"
    if isinstance(args[0] if args else None, DeviceTensor):
        result = func(*args, device=torch.device("turbine", device.index), **kwargs)
    elif name in RANDOM or name in FROM_DATA:
        result = to_device(func(*args, device="cpu", **kwargs), device)
    elif name in EMPTY:
        meta = func(*args, device="meta", **kwargs)
        result = empty(tuple(meta.shape), meta.dtype, device, meta.stride())
    else:
        result = _run_factory_kernel(func, name, args, kwargs, device)
    if requires_grad:
        result.requires_grad_(True)
    return result


#: Range factories torch has no boolean kernel for (logspace's refusal comes from its trace).
_NO_BOOL = ("arange", "linspace")

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
        if meta.dtype in STORAGE_ONLY:  # complex: IREE kernels do not take it (eager/dtypes.py)
            return to_device(func(*args, device="cpu", **kwargs), device)
        generic = _generic_factory(name, args, call_kwargs, fill, meta, device)
        if generic is not None:
            return generic
        check_dtype(meta.dtype, f"the result of torch.{name}")
        sizes = tuple(meta.shape)
        if meta.numel() == 0:
            return empty(sizes, meta.dtype, device)  # no values to compute (see dispatch._zero_size)
        inputs = [] if fill is None else [((), number_dtype(fill))]
        try:
            kernel = kernel_cache.kernel(
                ("factory",) + key[:4],
                device,
                lambda: lowering.lower(_traced(func, call_args, {**call_kwargs, "dtype": meta.dtype}, name), inputs),
                f"torch.{name}{_freeze(call_args)}",
            )
        except CompileError:
            # IREE 3.13 cannot compile some (a float arange's float64 steps): made on the host.
            log.info("torch.%s%s is made on the host and uploaded: its kernel does not compile", name, _freeze(args))
            return to_device(func(*args, device="cpu", **kwargs), device)
        entry = kernels[key] = (kernel, sizes, meta.dtype)
    kernel, sizes, dtype = entry
    check_fill_value(fill, dtype)
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


#: Factories that go shape-generic, each as the one it runs as (zeros and ones are fills).
_GENERIC = {"full": "full", "zeros": "full", "ones": "full", "arange": "arange"}


def _generic_factory(
    name: str, args: tuple, call_kwargs: dict, fill: int | float | None, meta: torch.Tensor, device: Device
) -> DeviceTensor | None:
    """The factory's result from its kind's shape-generic kernel, where the call goes generic
    (eager/dynamic.py); None to take the kernel compiled for this call's arguments."""
    kind = _GENERIC.get(name)
    if kind is None or meta.numel() == 0 or set(call_kwargs) - {"dtype", "fill_value"}:
        return None
    if kind == "full":
        fill = {"zeros": 0, "ones": 1}.get(name, fill)
        if fill is None:
            return None  # a bool or tensor fill value: compiled in
        check_fill_value(fill, meta.dtype)
        values = scalar_view(device, fill, number_dtype(fill))
        key: tuple = ("torch.full", meta.dim(), str(meta.dtype), str(number_dtype(fill)))
        geometry: tuple = tuple(meta.shape)
    else:
        if meta.dtype.is_floating_point or not all(type(a) is int for a in args):
            return None  # float ranges round as torch's kernel does: compiled per call
        start, step = (args[0] if len(args) > 1 else 0), (args[2] if len(args) > 2 else 1)
        values = int_vector(device, (start, step))
        key = ("torch.arange", 1, str(meta.dtype))
        geometry = args
    if not dynamic.generic(key, geometry, device):
        return None
    kernel = _generic_factory_kernel(key, kind, meta, fill, device)
    if kernel is None:
        return None
    carrier = sizes_carrier(values, meta.shape, ELEMENT_TYPES[meta.dtype])
    ((buffer, view),) = kernel.launch([carrier, values], NO_WAIT)
    return wrap(buffer, meta.dtype, tuple(meta.shape), view)


def _generic_factory_kernel(key: tuple, kind: str, meta: torch.Tensor, fill: Any, device: Device) -> Any:
    """The one kernel of a generic factory kind (None, and its calls compiled per size from now
    on, if it does not compile)."""
    rank, dtype = meta.dim(), meta.dtype

    def full(carrier: torch.Tensor, value: torch.Tensor) -> list[torch.Tensor]:
        return [torch.full(carrier.shape[:rank], value.to(dtype).item(), dtype=dtype)]

    def arange(carrier: torch.Tensor, start_step: torch.Tensor) -> list[torch.Tensor]:
        steps = torch.arange(carrier.shape[0], dtype=torch.int64)
        return [(start_step[0] + start_step[1] * steps).to(dtype)]

    carrier = (tuple(Dynamic(f"s{d}", 2) for d in range(rank)) + (0,), dtype)
    if kind == "full":
        traced, inputs = full, [carrier, ((), number_dtype(fill))]
    else:
        traced, inputs = arange, [carrier, ((2,), torch.int64)]
    try:
        return kernel_cache.kernel(
            ("factory", "generic", *key), device, lambda: lowering.lower(traced, inputs), f"{key[0]} of any size",
            {"dynamic": True},
        )
    except CompileError:
        dynamic.refuse_generic(key, device)
        return None
