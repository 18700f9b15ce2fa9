"""Runtime scalars: the 0-d device buffers that carry Python numbers (``x * 0.5``, a learning
rate, ``full``'s fill value) into kernels that take them as inputs, so a new value compiles nothing."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from turbine.config import config
from turbine.device import BufferView, Device, upload_scalar, view_of
from turbine.eager import runtime
from turbine.eager.dtypes import ELEMENT_TYPES



def scalar_view(device: Device, value: Any, dtype: torch.dtype, wraps: bool = False) -> BufferView:
    """A 0-d device buffer holding a runtime scalar (Python numbers are reused from a small cache).

    An int ``dtype`` cannot hold raises torch's overflow error, unless the op ``wraps`` it as
    torch's binary ops do (``uint8_image < 256`` compares with 0, as in torch)."""
    if isinstance(value, torch.Tensor):
        return _upload_scalar(device, value.to(dtype))
    # float.hex tells -0.0 from 0.0 (equal, and equal hashes, as dict keys) and lets NaN hit.
    key = (type(value), value.hex() if type(value) is float else value, dtype)
    if wraps and type(value) is int:
        return _kept(device, (*key, "wrapped"), lambda: torch.tensor(value).to(dtype))
    return _kept(device, key, lambda: torch.tensor(value, dtype=dtype))


#: Binary ops whose Python number operand torch makes a 0-d int64 tensor and converts to the
#: tensor's dtype, wrapping (uint8 + 300 adds 44); torch's other ops refuse a number their dtype
#: cannot hold (fill, clamp, masked_fill, where, an alpha).
_WRAPPING = frozenset(
    "add sub rsub mul div true_divide floor_divide remainder fmod bitwise_and bitwise_or bitwise_xor "
    "and or xor iand ior ixor eq ne lt le gt ge bitwise_left_shift bitwise_right_shift lshift rshift "
    "ilshift irshift".split()
)


def wraps_its_operand(func: Any, signature: tuple, scalars: int) -> bool:
    """Whether the first of the ``scalars`` runtime scalars of a kernel of ``func`` with this
    ``signature``, a Python number operand, wraps to its dtype. Not when it is add/sub's
    ``alpha`` (a keyword, so the last scalar, and named in the signature), which torch refuses
    where the dtype cannot hold it (``add(uint8, uint8, alpha=300)``)."""
    if func.overloadpacket.__name__.strip("_") not in _WRAPPING:
        return False
    return not (scalars == 1 and "alpha" in signature)


def check_fill_value(fill: Any, dtype: torch.dtype) -> None:
    """torch's refusal of an integer fill value its dtype cannot hold (``full(s, 256,
    dtype=torch.uint8)``, ``full_like``), which a kernel, converting the value, would wrap."""
    if type(fill) is int and dtype in _NARROW_INTEGERS:
        info = torch.iinfo(dtype)
        if not info.min <= fill <= info.max:
            torch.full((), fill, dtype=dtype)  # raises torch's error where torch refuses the value


_NARROW_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32)


def int_vector(device: Device, values: tuple[int, ...]) -> BufferView:
    """A 1-D int64 device buffer of ``values`` (a view's strides and offset, a factory's sizes'
    companions), kept like numbers so that a loop over the same views uploads nothing."""
    return _kept(device, ("int vector", values), lambda: torch.tensor(values, dtype=torch.int64))


def _kept(device: Device, key: tuple, make: Callable[[], torch.Tensor]) -> BufferView:
    """The device's cached upload for ``key``, made from ``make()`` the first time (the oldest
    entry goes when the cache holds ``config.scalar_cache_size``)."""
    views = runtime.state.device(device.index).scalar_views
    view = views.get(key)
    if view is None:
        if len(views) >= config.scalar_cache_size:
            views.pop(next(iter(views)))
        view = views[key] = _upload_scalar(device, make())
    return view


def number_dtype(value: int | float) -> torch.dtype:
    """The dtype a number crosses in when a kernel takes it as a number: 64 bits, as Python holds it."""
    return torch.float64 if type(value) is float else torch.int64


def _upload_scalar(device: Device, value: torch.Tensor) -> BufferView:
    raw = value.reshape(-1).view(torch.uint8).numpy()
    buffer = upload_scalar(device, np.ascontiguousarray(raw))
    return view_of(buffer, list(value.shape), ELEMENT_TYPES[value.dtype])
