"""DeviceTensor: a torch wrapper tensor whose data lives in an IREE device buffer.

Views follow torch: a tensor is (Storage, sizes, strides, offset), and views share the Storage.
The Storage owns the current Buffer; an in-place op installs a new Buffer in it, so every view
of it sees the change. Buffers themselves are never written after they are produced.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.device import Buffer, BufferView, Device, view_of
from turbine.eager import conversion, formatting
from turbine.eager.dtypes import ELEMENT_TYPES, check_dtype


class Storage:
    """The memory behind a tensor and all its views: ``numel`` elements of ``dtype`` in ``buffer``."""

    __slots__ = ("device", "dtype", "numel", "buffer", "__weakref__")

    def __init__(self, device: Device, dtype: torch.dtype, numel: int, buffer: Buffer) -> None:
        self.device = device
        self.dtype = dtype
        self.numel = numel
        self.buffer = buffer


class ReinterpretedStorage(Storage):
    """A complex storage's memory seen as its real and imaginary parts (``view_as_real``), or a
    real storage's as complex numbers (``view_as_complex``): the same buffer, so a write through
    either installs its new buffer in the storage it views, and every view of that sees it."""

    __slots__ = ("base",)

    def __init__(self, base: Storage, dtype: torch.dtype) -> None:
        self.base = base
        self.device = base.device
        self.dtype = dtype
        ratio = base.dtype.itemsize / dtype.itemsize
        self.numel = int(base.numel * ratio)

    @property
    def buffer(self) -> Buffer:
        return self.base.buffer

    @buffer.setter
    def buffer(self, buffer: Buffer) -> None:
        self.base.buffer = buffer


def contiguous_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def stride_order(strides: tuple) -> list[int]:
    """The dims from outermost to innermost in memory (ties in dim order)."""
    return sorted(range(len(strides)), key=lambda d: (-strides[d], d))


def inverse(order: list[int]) -> list[int]:
    """The permutation that undoes ``order``."""
    return sorted(range(len(order)), key=order.__getitem__)


def dense_in_order(sizes: tuple, strides: tuple) -> bool:
    """torch's ``is_non_overlapping_and_dense``: the elements fill a block of memory, in some
    order of dims. Dims of size 1 have no place in memory: their strides are not looked at."""
    expected = 1
    for d in reversed(stride_order(strides)):
        if sizes[d] != 1 and strides[d] != expected:
            return False
        expected *= sizes[d]
    return True


def non_overlapping(sizes: tuple, strides: tuple) -> bool:
    """Whether no two elements of a tensor of these sizes and strides share memory."""
    span = 1
    for stride, size in sorted((stride, size) for size, stride in zip(sizes, strides) if size > 1):
        if stride < span:
            return False
        span = stride * size
    return True


def memory_order(sizes: tuple, strides: tuple) -> list[int] | None:
    """The dims from outermost to innermost in memory, where ``strides`` lay the elements out
    densely in an order other than row-major; else None (row-major, not dense, or empty)."""
    if 0 in sizes or not dense_in_order(sizes, strides):
        return None
    row_major = contiguous_strides(tuple(sizes))
    if all(strides[d] == row_major[d] for d in range(len(sizes)) if sizes[d] != 1):
        return None
    return stride_order(strides)


def dense_strides_like(sizes: tuple, strides: tuple) -> tuple[int, ...]:
    """Dense strides in the order of ``strides`` (torch's layout for a copy of a view that is
    not dense: the same order of dims, the gaps closed)."""
    dense, step = [0] * len(sizes), 1
    for d in reversed(stride_order(strides)):
        dense[d] = step
        step *= max(sizes[d], 1)
    return tuple(dense)


def rebuild(host: torch.Tensor, device: str, requires_grad: bool, parameter: bool = False) -> torch.Tensor:
    """A pickled DeviceTensor back: on the device it was saved from (by name: ``turbine:cpu``), or
    on the device ``torch.load(map_location=...)`` maps that name to, ``"cpu"`` included."""
    target = torch._utils._get_restore_location(device)  # torch.load's map_location, if any
    tensor = host.to(target)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def numel_of(sizes: tuple[int, ...]) -> int:
    count = 1
    for size in sizes:
        count *= size
    return count


class DeviceTensor(torch.Tensor):
    """A tensor on a turbine device. Every aten op on it runs on that device (see eager/dispatch.py).

    Its state lives in instance attributes, not ``__slots__``: ``torch.utils.swap_tensors``, which
    ``module.to(...)`` uses for tensor subclasses, swaps two tensors only when their slots match,
    and the CPU parameter being moved has none.
    """

    @staticmethod
    def __new__(
        cls,
        storage: Storage,
        sizes: tuple[int, ...],
        strides: tuple[int, ...] | None = None,
        offset: int = 0,
        requires_grad: bool = False,
    ) -> "DeviceTensor":
        sizes = tuple(sizes)
        dense_strides = contiguous_strides(sizes)
        strides = dense_strides if strides is None else tuple(strides)
        self = torch.Tensor._make_wrapper_subclass(
            cls,
            sizes,
            strides=strides,
            storage_offset=offset,
            dtype=storage.dtype,
            device=torch_device(storage.device),
            requires_grad=requires_grad,
        )
        self._storage = storage
        # Dense: the tensor is exactly its whole storage, row-major, so kernels can read the
        # buffer as it is; any other view is gathered first (eager/views.py).
        self._dense = offset == 0 and storage.numel == numel_of(sizes) and strides == dense_strides
        if self._dense:
            self._key = (sizes, storage.dtype)
        else:
            self._key = (sizes, storage.dtype, strides, offset, storage.numel)
        self._view_cache = None
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    #: Dims whose kernels take any size from the first call (``turbine.mark_dynamic``).
    _dynamic_dims: frozenset = frozenset()

    #: What runs every aten op on a DeviceTensor: eager/dispatch.py's ``handle``, installed by
    #: the package (eager/__init__.py). Kept as a slot so this module, which everything in eager/
    #: builds tensors with, does not import the dispatcher that sits above it.
    dispatcher: Callable[[Any, tuple, dict], Any]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls.dispatcher(func, args, kwargs or {})

    def _become(self, other: "DeviceTensor") -> None:
        """Take ``other``'s sizes, strides, dtype and storage in place (``t.data = other``,
        ``squeeze_``, ``t_``, resizing ``out=``), keeping this tensor's identity and autograd state.

        torch keeps a wrapper tensor's sizes and dtype in its C++ object, which torch's own
        ``.data`` setter replaces; the Python attributes that say where the values are follow.
        """
        torch._C.TensorBase.data.__set__(self, other)
        self._storage = other._storage
        self._dense = other._dense
        self._key = other._key
        self._view_cache = other._view_cache

    @property
    def data(self) -> torch.Tensor:
        """A new tensor over the same storage that autograd does not track (as torch's ``.data``)."""
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, other: torch.Tensor) -> None:
        """``t.data = other``: ``t`` takes ``other``'s values, shape, dtype and device and stays
        ``t``, as torch's own ``.data`` does between CPU and CUDA tensors. ``module.half()`` and
        ``module.cpu()`` move parameters this way, so a parameter two modules share stays shared."""
        if isinstance(other, DeviceTensor):
            self._become(other)
        elif type(other) in (torch.Tensor, torch.nn.Parameter) and other.device.type == "cpu":
            conversion.leave_device(self, other)
        else:
            raise RuntimeError(
                f"cannot set .data of a {self.turbine_device.name} tensor to a {type(other).__name__} on "
                f"{other.device}: move the value to the CPU or to a turbine device first"
            )

    @staticmethod
    def __tensor_unflatten__(inner: dict, context: Any, outer_size: Any, outer_stride: Any) -> "DeviceTensor":
        """Half of torch's traceable-subclass protocol, which module conversions look for (see
        eager/conversion.py); the other half is set only on tensors being moved into a module."""
        raise NotImplementedError(
            "torch.compile and torch.export cannot trace turbine tensors yet: run the region eagerly, "
            "or compile it on CPU tensors"
        )

    @property
    def turbine_device(self) -> Device:
        """The IREE device holding this tensor (``.device`` gives torch's view of it)."""
        return self._storage.device

    def buffer_view(self) -> BufferView:
        """This dense tensor's buffer as a buffer view of its shape (cached until the storage changes)."""
        buffer = self._storage.buffer
        cached = self._view_cache
        if cached is not None and cached[0] is buffer:
            return cached[1]
        view = view_of(buffer, self.shape, ELEMENT_TYPES[self.dtype])
        self._view_cache = (buffer, view)
        return view

    def __repr__(self, *, tensor_contents=None) -> str:
        return formatting.tensor_repr(self)

    def __format__(self, format_spec: str) -> str:
        """A 0-d tensor formats as its number (``f"{loss:.4f}"``), as torch's own tensors do;
        torch's ``__format__`` does so only for the class ``torch.Tensor`` itself."""
        if self.dim() == 0:
            return self.detach().item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __reduce_ex__(self, protocol: int) -> tuple:
        """Pickled (``torch.save``, ``pickle``) as its values on the host and its device's name, so
        a checkpoint holds no IREE object; loading puts it back on a device of that name, or where
        ``torch.load``'s ``map_location`` says."""
        with torch.no_grad():
            host = self.detach().cpu()
        return (rebuild, (host, self.turbine_device.name, self.requires_grad, bool(getattr(self, "_is_param", False))))

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        """A copy on the same device, with its own buffer (torch's rule: graph leaves only)."""
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the moment. "
                "If you were attempting to deepcopy a module, this may be because of a torch.nn.utils.weight_norm usage, "
                "see https://github.com/pytorch/pytorch/pull/103001"
            )
        with torch.no_grad():
            copied = self.clone()
        if getattr(self, "_is_param", False):
            copied = torch.nn.Parameter(copied, self.requires_grad)
        else:
            copied.requires_grad_(self.requires_grad)
        memo[id(self)] = copied
        return copied

    def numpy(self, *args, **kwargs):
        raise TypeError(
            f"can't convert {self.turbine_device.name} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def tolist(self):
        return self.cpu().tolist()


def permuted(tensor: DeviceTensor, order: list[int]) -> DeviceTensor:
    """A view of ``tensor`` with its dims in ``order``; its strides row-major where it is row-major
    but for dims of size 1 (whose strides nothing reads), so kernels read its buffer as it is."""
    sizes = tuple(tensor.shape[d] for d in order)
    strides = tuple(tensor.stride()[d] for d in order)
    row_major = contiguous_strides(sizes)
    if all(stride == row_major[d] for d, (size, stride) in enumerate(zip(sizes, strides)) if size != 1):
        strides = row_major
    return DeviceTensor(tensor._storage, sizes, strides, tensor.storage_offset())


def wrap(buffer: Buffer, dtype: torch.dtype, sizes: tuple[int, ...], view: BufferView | None = None) -> DeviceTensor:
    """A new dense DeviceTensor over a buffer, optionally with its ready-made buffer view."""
    sizes = tuple(sizes)
    tensor = DeviceTensor(Storage(buffer.device, dtype, numel_of(sizes), buffer), sizes)
    if view is not None:
        tensor._view_cache = (buffer, view)
    return tensor


def empty(sizes: tuple[int, ...], dtype: torch.dtype, device: Device, strides: tuple[int, ...] | None = None) -> DeviceTensor:
    """An uninitialised tensor: a fresh buffer, no kernel, no transfer. Row-major, unless given
    ``strides`` (torch's for a memory format, or ``empty_strided``'s), whose storage spans them;
    strides under which elements would share memory are not kept (in-place ops refuse such a
    tensor, where torch's ``fill_`` and ``zero_`` write it)."""
    check_dtype(dtype)
    sizes = tuple(sizes)
    numel = numel_of(sizes)
    if strides is not None and not non_overlapping(sizes, tuple(strides)):
        strides = None
    if strides is not None and numel:
        numel = 1 + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    buffer = Buffer(device, device.allocate(numel * dtype.itemsize))
    return DeviceTensor(Storage(device, dtype, numel, buffer), sizes, None if strides is None else tuple(strides))


class DenseLayout:
    """Everything about a dense result that a plan knows before it runs, so making the tensor is cheap."""

    __slots__ = ("sizes", "dtype", "numel", "nbytes", "key")

    def __init__(self, sizes: tuple[int, ...], dtype: torch.dtype) -> None:
        self.sizes = tuple(sizes)
        self.dtype = dtype
        self.numel = numel_of(self.sizes)
        self.nbytes = self.numel * dtype.itemsize
        self.key = (self.sizes, dtype)

    def make(self, buffer: Buffer, view: BufferView | None, device: torch.device) -> DeviceTensor:
        """A new dense DeviceTensor over ``buffer`` (the hot path of every kernel result); ``view``
        is None for a buffer whose launch waits on a compile (eager/deferred.py)."""
        # Contiguous strides are the default; leaving them out makes this call measurably cheaper.
        tensor = torch.Tensor._make_wrapper_subclass(DeviceTensor, self.sizes, dtype=self.dtype, device=device)
        tensor._storage = Storage(buffer.device, self.dtype, self.numel, buffer)
        tensor._dense = True
        tensor._key = self.key
        tensor._view_cache = None if view is None else (buffer, view)
        return tensor


class ViewLayout:
    """A view's geometry over a storage of ``storage_numel`` elements, worked out once by its plan
    (whether it is dense, its plan-cache key), so making each view is one wrapper call."""

    __slots__ = ("sizes", "strides", "offset", "storage_numel", "dense", "key")

    def __init__(self, sizes: tuple, strides: tuple, offset: int, storage_numel: int, dtype: torch.dtype) -> None:
        self.sizes, self.strides, self.offset, self.storage_numel = tuple(sizes), tuple(strides), offset, storage_numel
        self.dense = offset == 0 and storage_numel == numel_of(self.sizes) and self.strides == contiguous_strides(self.sizes)
        self.key = (self.sizes, dtype) if self.dense else (self.sizes, dtype, self.strides, offset, storage_numel)

    def make(self, storage: Storage, device: torch.device) -> DeviceTensor:
        """A DeviceTensor of this geometry over ``storage`` (whose numel is ``storage_numel``)."""
        tensor = torch.Tensor._make_wrapper_subclass(
            DeviceTensor, self.sizes, strides=self.strides, storage_offset=self.offset, dtype=storage.dtype, device=device
        )
        tensor._storage = storage
        tensor._dense = self.dense
        tensor._key = self.key
        tensor._view_cache = None
        return tensor


_torch_devices: dict[int, torch.device] = {}


def torch_device(device: Device) -> torch.device:
    """``torch.device("turbine", k)`` for a Device, made once."""
    result = _torch_devices.get(device.index)
    if result is None:
        result = _torch_devices[device.index] = torch.device("turbine", device.index)
    return result

