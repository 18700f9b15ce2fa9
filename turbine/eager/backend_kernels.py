"""Kernels for torch's C++ paths into the turbine key, where ``__torch_dispatch__`` is not asked.

torch's own C++ code (``x[0] = 5``, ``Tensor.to``, ``new_tensor``) makes tensors with
``at::empty(..., device=turbine)`` and fills them with ``_copy_from``, at times with Python
dispatch turned off; those calls reach the PrivateUse1 backend's kernels, registered here.
``torch.tensor([a, b])`` of 0-d turbine tensors reads each with ``_local_scalar_dense`` that way.
"""

from __future__ import annotations

import torch

from turbine.device import by_index
from turbine.eager import dispatch
from turbine.eager.tensor import empty

_library: torch.library.Library | None = None


def register() -> None:
    """Give torch ``empty``, ``empty_strided``, ``_copy_from``, ``_efficientzerotensor`` and
    ``_local_scalar_dense`` for the turbine key (once)."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    _library.impl("_efficientzerotensor", _efficient_zero_tensor, "PrivateUse1")
    _library.impl("empty_strided", _empty_strided, "PrivateUse1")
    _library.impl("_copy_from", _copy_from, "PrivateUse1")
    _library.impl("_local_scalar_dense", _local_scalar_dense, "PrivateUse1")


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    strides = None
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        strides = torch.empty(tuple(size), device="meta", memory_format=memory_format).stride()
    return empty(tuple(size), dtype or torch.get_default_dtype(), by_index(device.index or 0), strides)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return empty(tuple(size), dtype or torch.get_default_dtype(), by_index(device.index or 0), tuple(stride))


def _copy_from(source, destination, non_blocking=False):
    return dispatch.run(torch.ops.aten.copy_.default, (destination, source), {})


def _local_scalar_dense(tensor):
    return dispatch.run(torch.ops.aten._local_scalar_dense.default, (tensor,), {})


def _efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    """What autograd makes for gradients known to be zero (sgn's, for one): plain zeros here."""
    return torch.zeros(tuple(size), dtype=dtype or torch.get_default_dtype(), device=device)
