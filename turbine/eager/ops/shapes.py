"""Ops that change a tensor's shape or storage in place, allocate, or copy without a kernel, and
questions answered from shapes alone."""

from __future__ import annotations

import math
from typing import Any

import torch

from turbine.eager import factories
from turbine.eager.meta import meta_call
from turbine.eager.registry import declare
from turbine.eager.schema import bound_arguments, functional_variant, schema_of
from turbine.eager.signature import walk
from turbine.eager.tensor import DeviceTensor, Storage, empty
from turbine.eager.views import write

aten = torch.ops.aten


def _restride(func: Any, args: tuple, kwargs: dict) -> Any:
    """In-place ops that change a tensor's shape (``squeeze_``, ``t_``, ``transpose_``, ...):
    the tensor becomes the view its out-of-place twin gives."""
    target = args[0]
    target._become(functional_variant(func)(*args, **kwargs))
    return target


def _resize(func: Any, args: tuple, kwargs: dict) -> Any:
    """``resize_``: contiguous over the same storage from the same offset, the storage grown in
    place when too small (its old elements kept), as torch grows it: the base and every other
    view of the storage see what is written into the resized tensor."""
    target, sizes = args[0], tuple(args[1])
    numel = math.prod(sizes)
    storage = target._storage
    offset = target.storage_offset()
    if offset + numel > storage.numel:
        storage = _grown(storage, offset + numel)
    target._become(DeviceTensor(storage, sizes, None, offset))
    return target


def _grown(storage: Storage, numel: int) -> Storage:
    """``storage`` holding ``numel`` elements, its old ones first: the same Storage object with a
    larger buffer, so every tensor over it keeps seeing it. (A complex storage's view as its real
    parts, whose base counts elements of another size, gets a storage of its own.)"""
    grown = empty((numel,), storage.dtype, storage.device)
    if storage.numel:
        write(grown[: storage.numel], DeviceTensor(storage, (storage.numel,)))
    if type(storage) is not Storage:
        return grown._storage
    storage.buffer, storage.numel = grown._storage.buffer, numel
    return storage


def _empty(func: Any, args: tuple, kwargs: dict) -> Any:
    """Uninitialised tensors: a fresh buffer, no kernel."""
    schema = schema_of(func)
    leaves = walk(func, schema, args, kwargs)
    meta = meta_call(func, schema, args, kwargs)
    return empty(tuple(meta.shape), meta.dtype, leaves.device, meta.stride())  # a memory format's strides too


def _lazy_view_as_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    """torch's lazy conjugate and negative views (``x.conj()`` of a complex tensor) as copies.

    A turbine tensor has no conjugate or negative bit, so such a view holds the values it shows;
    it does not alias its base, which no turbine op needs, but a view made that way would silently
    drop the conjugation.
    """
    physical = aten.conj_physical.default if func is aten._conj.default else aten.neg.default
    return physical(*args, **kwargs)


def _factory_out(func: Any, args: tuple, kwargs: dict) -> Any:
    """A factory's ``out=`` form (``torch.arange(5, out=t)``): the factory's values, written into
    ``t``, resized first (silently, as torch's factories resize theirs; a range only where the
    number of elements differs). torch's C++ code reaches a device through these: ``at::linspace``
    is an empty tensor and ``linspace_out`` (affine_grid's gradient), ``at::eye`` an empty tensor
    and ``eye_out``, and ``one_hot`` calls ``arange_out``."""
    named = dict(kwargs)
    out = named.pop("out")
    factory = getattr(torch, func.overloadpacket.__name__)
    values = factories.create(factory, args, named | {"dtype": out.dtype}, out._storage.device)
    if func.overloadpacket in _RANGES and values.numel() == out.numel():
        values = values.reshape(out.shape)  # the range's values in the out tensor's own order
    elif values.shape != out.shape:
        out.resize_(values.shape)
    out.copy_(values)
    return out


#: Factories whose ``out=`` form keeps the out tensor's shape where it holds as many elements.
_RANGES = (aten.arange, aten.linspace, aten.logspace)

#: The factories' ``out=`` forms: their out-of-place forms take a device and a dtype besides, so
#: the generic way finds no twin for them (eager/plans.py's MutationPlan).
_FACTORY_OUTS = [
    "arange.out", "arange.start_out", "linspace.out", "logspace.out", "zeros.out", "ones.out", "full.out",
    "eye.out", "eye.m_out", "rand.out", "rand.generator_out", "randn.out", "randn.generator_out",
    "randperm.out", "randperm.generator_out",
]
declare(_FACTORY_OUTS, "the factory's values written into the out= tensor", handler=_factory_out)

declare(aten.resize_.default, "the tensor takes a contiguous geometry over its storage, grown when too small", handler=_resize)
declare(
    ["squeeze_.default", "squeeze_.dim", "squeeze_.dims", "unsqueeze_.default", "t_.default", "transpose_.default",
     "as_strided_.default"],
    "an in-place shape change: the tensor becomes the view its out-of-place twin gives",
    handler=_restride,
)
def _storage_numel(tensor: torch.Tensor) -> int:
    """How many of the tensor's elements its storage holds, as torch counts them (bytes / itemsize)."""
    if isinstance(tensor, DeviceTensor):
        storage = tensor._storage
        return storage.numel * storage.dtype.itemsize // tensor.element_size()
    return tensor.untyped_storage().nbytes() // tensor.element_size()


def _is_same_size(func: Any, args: tuple, kwargs: dict) -> bool:
    return args[0].shape == args[1].shape


def _has_same_storage_numel(func: Any, args: tuple, kwargs: dict) -> bool:
    return _storage_numel(args[0]) == _storage_numel(args[1])


def _new_zeros_with_same_feature_meta(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """Zeros laid out as ``other`` is (its sizes, strides, offset and storage size), behind
    ``self``'s first ``self_num_batch_dims`` sizes laid one storage after another, as torch's
    kernel makes them: forward-mode AD makes a view's tangent this way."""
    named = bound_arguments(func, args, kwargs)
    self, other, batch_dims = named["self"], named["other"], named.get("self_num_batch_dims", 0)
    sizes, strides = list(self.shape[:batch_dims]) + list(other.shape), list(other.stride())
    storage_numel = _storage_numel(other)
    for size in reversed(self.shape[:batch_dims]):
        strides.insert(0, storage_numel)
        storage_numel *= size
    return other.new_zeros((storage_numel,)).as_strided(sizes, strides, other.storage_offset())


declare(
    aten._new_zeros_with_same_feature_meta.default,
    "zeros viewed as another tensor is laid out: a fill and a view, where the kernel did not compile",
    handler=_new_zeros_with_same_feature_meta,
)
declare(
    aten.is_same_size.default,
    "a question of shapes (forward-mode AD asks it of every tangent): the host answers, where it fell back",
    handler=_is_same_size,
)
declare(
    aten._has_same_storage_numel.default,
    "a question of storage sizes (forward-mode AD asks it of every tangent): the host answers, where it fell back",
    handler=_has_same_storage_numel,
)
declare(
    ["empty_like.default", "new_empty.default", "new_empty_strided.default", "empty.memory_format"],
    "uninitialised: a fresh buffer, no kernel",
    handler=_empty,
)
declare(
    [aten._conj.default, aten._neg_view.default],
    "turbine tensors have no conjugate or negative bit: the lazy view is made as a copy",
    handler=_lazy_view_as_copy,
)
declare(
    [aten._unsafe_view.default, aten.clone.default, aten.view_copy.default, aten._reshape_copy.default,
     aten.alias_copy.default, aten.detach_copy.default, aten.lift_fresh_copy.default],
    "buffers are never written once made, so sharing the input's is as good as a copy",
    traits=["same_elements"],
)
declare(
    [aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce, aten.scatter_add.default,
     aten.scatter_reduce.two],
    "an empty index writes nothing, so it is no reason to fall back: gather's gradient for an empty index is a "
    "scatter_add of nothing into zeros. (index_add, index_copy, index_fill, index_put, put and masked_scatter "
    "are not here: their shape rules let calls through that torch's kernels refuse, a source of another dtype "
    "or length among them, and only the fallback gives torch's error)",
    traits=["writes_by_index"],
)
declare(
    [aten.new_zeros, aten.new_ones, aten.new_full, aten.zeros_like, aten.ones_like, aten.full_like],
    "only the input's dtype and device are read, so an empty input is no reason to fall back",
    traits=["value_blind"],
)
