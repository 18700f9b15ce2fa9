"""Running one aten op on a turbine device: the body of ``DeviceTensor.__torch_dispatch__``.

An op call is walked into a key (op, each tensor's shape/dtype/layout, compiled-in constants,
the kinds of runtime scalars). The first call with a key builds a plan, checked by running the
op on meta tensors (which also gives torch's own error messages); later calls run the plan:

- KernelPlan: one compiled IREE kernel (from the kernel cache) enqueued with fences;
- ViewPlan: a view of the input's storage, no kernel;
- MutationPlan: in-place and ``out=`` ops, as their out-of-place twin plus a write-back;
- FallbackPlan: an op IREE cannot run (no lowering, data-dependent shapes) goes to the fallback
  policy (eager/fallback.py) on every call, without trying the compiler again.

A plan's ``record()`` describes it for eager/saved_plans.py, which keeps plans on disk: a new
process takes a key's plan from its record instead of building it again.

A few ops that move data or need torch's CPU semantics are handled before that (SPECIAL).
"""

from __future__ import annotations

import atexit
import math
import warnings
from typing import Any, Callable

import torch

from turbine.counters import counters
from turbine.device import Device, by_index, join
from turbine.eager import backward_errors, batch_norm, deferred, fallback, foreach, host, lowering, masked, saved_plans
from turbine.eager.dtypes import check_kernel_dtype
from turbine.eager.scalars import number_dtype, scalar_view
from turbine.eager.schema import OpSchema, functional_variant, functionalized_variant, schema_of
from turbine.eager.signature import Leaves, is_runtime, rebuild, walk
from turbine.eager.tensor import DenseLayout, DeviceTensor, Storage, contiguous_strides, empty, torch_device
from turbine.eager.transfer import to_device
from turbine.eager.views import dense, meta_like, to_host, write
from turbine.errors import CompileError, UnsupportedOpError
from turbine.kernels_cache import CompilingKernel, Kernel, kernel_cache


aten = torch.ops.aten

_plans: dict[tuple, Callable] = {}
_handlers: dict[Any, Callable] = {}
_schemas: dict[Any, OpSchema] = {}


def handle(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """``DeviceTensor.__torch_dispatch__``: run the op; inside a backward call, a failure is held
    until the backward returns (eager/backward_errors.py) and autograd gets a stand-in."""
    try:
        return run(func, args, kwargs)
    except Exception as error:
        if not backward_errors.active():
            raise
        return backward_errors.hold(error, lambda: stand_in(func, args, kwargs))


def run(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on turbine tensors; the result is made of new or updated DeviceTensors."""
    handler = _handlers.get(func)
    if handler is None:
        handler = _handlers[func] = _choose_handler(func)
    return handler(func, args, kwargs)


def _choose_handler(func: Any) -> Callable:
    """How an op runs: a SPECIAL handler, one op per list element for ``_foreach_``, torch's own
    decomposition for a composite op, else a plan."""
    if func in SPECIAL:
        return SPECIAL[func]
    if func.overloadpacket.__name__.startswith("_foreach_"):
        return foreach.run
    if func._can_decompose():
        return _decompose
    return _plan_and_run


def _decompose(func: Any, args: tuple, kwargs: dict) -> Any:
    """A CompositeImplicitAutograd op (``to.dtype_layout``, ``linear``) as the ops torch defines
    it with. Autograd decomposes these before they reach a device; under ``torch.inference_mode``
    autograd is skipped and they arrive whole."""
    return func.decompose(*args, **kwargs)


def _schema(func: Any) -> OpSchema:
    """The op's schema, worked out once per overload."""
    return _schemas.get(func) or _schemas.setdefault(func, schema_of(func))


def _plan_and_run(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` through the plan its key selects, building the plan on the first call."""
    schema = _schema(func)
    leaves = walk(func, schema, args, kwargs)
    # A plan holds kernels loaded on one device, so the device is part of its key (the kernel
    # cache shares compiled modules between devices of one target by itself).
    key = (*leaves.key, leaves.device.index if leaves.device is not None else None)
    plan = _plans.get(key)
    if plan is None:
        plan = _new_plan(func, schema, args, kwargs, leaves, key)
    return plan(leaves, args, kwargs)


def _new_plan(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, key: tuple) -> Callable:
    """A key's plan, kept in the plan cache: from its saved record if a file has one, else built."""
    record = saved_plans.take(key, leaves.device) if leaves.device is not None else None
    try:
        plan = _from_record(func, schema, leaves, record) if record is not None else None
    except (ValueError, TypeError, KeyError, IndexError):
        plan = None  # a record of another layout (a file edited by hand): built as if it had none
    if plan is None:
        try:
            plan = _build_plan(func, schema, args, kwargs, leaves)
        except (CompileError, UnsupportedOpError) as reason:
            if schema.aliased_output and not schema.written:
                raise  # a copy made by torch would not alias the input as a view must
            plan = _FallbackPlan(func, reason)
        saved_plans.built()
    _plans[key] = plan
    if isinstance(plan, _KernelPlan):
        plan.forget = lambda: _plans.pop(key, None)
    return plan


def _from_record(func: Any, schema: OpSchema, leaves: Leaves, record: tuple) -> Callable | None:
    """The plan a saved record describes (the plans' ``record`` methods), or None when its
    kernel is no longer in the kernel cache."""
    kind = record[0]
    if kind == "kernel":
        _, signature, digest, scalar_dtypes, layouts, structure = record
        kernel = kernel_cache.stored(signature, leaves.device, digest)
        if kernel is None:
            return None
        plan: Callable = _KernelPlan(func, leaves.device, kernel, signature, list(scalar_dtypes), layouts, structure)
    elif kind == "view":
        plan = _ViewPlan(record[1], record[2])
    elif kind == "mutation":
        plan = _MutationPlan(func, schema)
    elif kind == "share":
        plan = _SharePlan(record[1])
    else:
        plan = _EmptyPlan(leaves.device, record[1], record[2])
    counters.plans_from_disk += 1
    return plan


class _FallbackPlan:
    """An op IREE cannot run: every call goes to the fallback policy in force at that call."""

    def __init__(self, func: Any, reason: Exception) -> None:
        self.func = func
        self.reason = reason

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        return fallback.run(self.func, args, kwargs, self.reason)

    def record(self) -> None:
        return None  # decided again in each process (the kernel cache remembers a failed compile)


def stand_in(func: Any, args: tuple, kwargs: dict) -> Any:
    """What a failed call inside backward hands autograd (eager/backward_errors.py).

    Ops that write their arguments return those; others, uninitialised tensors of the result's shapes.
    """
    schema = _schema(func)
    if schema.out_names:
        outs = [kwargs[name] for name in schema.out_names]
        return outs[0] if len(outs) == 1 else tuple(outs)
    if schema.written:
        return args[schema.written[0]]
    device = host.device_of(args, kwargs)
    meta_out = _meta_call(func, schema, args, kwargs)
    return backward_errors.uninitialised_like(meta_out, lambda m: empty(tuple(m.shape), m.dtype, device))


def clear_plans() -> None:
    """Forget every plan, and the saved plans read so far (tests use it to show that kernels
    and plans come back from disk)."""
    _plans.clear()
    saved_plans.forget()


atexit.register(lambda: saved_plans.save(_plans))


# --- building plans -------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A key with only plain values, for the kernel cache's on-disk digest."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    if isinstance(value, type):
        return value.__name__
    return str(value)


def _describe(func: Any, leaves: Leaves) -> str:
    inputs = ", ".join(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}" for t in leaves.tensors)
    return f"{func}({inputs})"


def _host_devices(value: Any, replacement: str) -> Any:
    """Replace turbine torch.device arguments: traces and meta runs happen off the device."""
    if isinstance(value, torch.device) and value.type == "turbine":
        return torch.device(replacement)
    return value


def _meta_call(func: Any, schema: OpSchema, args: tuple, kwargs: dict) -> Any:
    meta_args, meta_kwargs = rebuild(schema, args, kwargs, meta_like, lambda value: value)
    meta_kwargs = {name: _host_devices(value, "meta") for name, value in meta_kwargs.items()}
    try:
        with warnings.catch_warnings():
            # resize_out warns on every call that resizes; the meta run happens once per plan.
            warnings.filterwarnings("ignore", "An output with one or more elements was resized")
            return func(*meta_args, **meta_kwargs)
    except NotImplementedError as error:
        raise UnsupportedOpError(
            f"{func} has no shape rule in torch (its output shape may depend on the data)"
        ) from error
    except Exception as error:
        if "data-dependent" in str(error) or type(error).__name__ == "DynamicOutputShapeException":
            raise UnsupportedOpError(f"{func} has an output shape that depends on the data") from error
        _raise_as_torch_cpu(func, schema, args, kwargs)
        # torch's CPU kernel takes the call: only the meta rule cannot (it reads values, say).
        raise UnsupportedOpError(f"{func} has no shape rule turbine can use ({error})") from error


def _raise_as_torch_cpu(func: Any, schema: OpSchema, args: tuple, kwargs: dict) -> None:
    """Re-raise a rejected call with torch's CPU wording (meta kernels word some checks differently).

    Runs the call on zero-filled CPU stand-ins of the same shapes; returns if the CPU accepts it.
    """

    def stand_in(tensor: DeviceTensor) -> torch.Tensor:
        return torch.zeros(tensor._storage.numel, dtype=tensor.dtype).as_strided(
            tensor.shape, tensor.stride(), tensor.storage_offset()
        )

    cpu_args, cpu_kwargs = rebuild(schema, args, kwargs, stand_in, lambda value: value)
    cpu_kwargs = {name: _host_devices(value, "cpu") for name, value in cpu_kwargs.items()}
    try:
        func(*cpu_args, **cpu_kwargs)
    except Exception as cpu_error:
        raise cpu_error.with_traceback(None) from None


def _build_plan(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves) -> Callable:
    if leaves.device is None:
        raise UnsupportedOpError(f"{func} reached turbine without a turbine tensor argument")
    if not schema.written and not schema.aliased_output:
        plan = _stored_kernel_plan(func, leaves)
        if plan is not None:
            return plan
    meta_out = _meta_call(func, schema, args, kwargs)
    if schema.written:
        return _MutationPlan(func, schema)
    if schema.aliased_output:
        return _view_plan(func, leaves, meta_out)
    metas, kind = _outputs(meta_out)
    if _zero_size(func, leaves, metas):
        return _EmptyPlan(leaves.device, _layouts_of(metas), kind)
    if _shares_buffer(func, leaves, metas):
        return _SharePlan(tuple(metas[0].shape))
    return _kernel_plan(func, schema, args, kwargs, leaves, meta_out)


#: Ops whose result is their input's elements in the same row-major order (``reshape`` after a
#: matmul is ``_unsafe_view``; ``contiguous()`` of a transposed result, once gathered, is ``clone``).
_SAME_ELEMENTS = {
    aten._unsafe_view.default,
    aten.clone.default,
    aten.view_copy.default,
    aten._reshape_copy.default,
    aten.alias_copy.default,
    aten.detach_copy.default,
    aten.lift_fresh_copy.default,
}


def _shares_buffer(func: Any, leaves: Leaves, metas: list) -> bool:
    """Whether the result can be a new storage over the buffer of its input's elements: turbine
    never writes into a buffer once made (device/buffer.py), so sharing one is as good as a copy."""
    if func not in _SAME_ELEMENTS or len(leaves.tensors) != 1 or len(metas) != 1 or metas[0] is None:
        return False
    out = metas[0]
    return out.dtype == leaves.tensors[0].dtype and out.stride() == contiguous_strides(tuple(out.shape))


class _SharePlan:
    """A copy or reshape: a new storage over the buffer of the input's elements (the input's
    own when it is dense, else the gather that makes it dense), no kernel of its own. A kernel
    that hands back its input would run on a device copy of it (kernels_cache/kernel.py)."""

    def __init__(self, sizes: tuple) -> None:
        self.sizes = sizes

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        source = dense(leaves.tensors[0])._storage
        return DeviceTensor(Storage(source.device, source.dtype, source.numel, source.buffer), self.sizes)

    def record(self) -> tuple:
        return ("share", self.sizes)


def _zero_size(func: Any, leaves: Leaves, metas: list) -> bool:
    """Whether every result has no elements (so no kernel is needed).

    IREE 3.13 is not to be trusted with empty tensors: its compiler crashes on some views of them
    (a division by zero in torch-mlir), and kernels reducing an empty tensor gave wrong values
    (the std of nothing came out as a number, not NaN). Calls whose results are all empty run no
    kernel; calls that read an empty tensor into a non-empty result go to the fallback policy,
    except those that never read their input's values (``new_zeros`` and friends).
    """
    outputs = [m for m in metas if m is not None]
    if outputs and all(m.numel() == 0 for m in outputs):
        return True
    if func.overloadpacket not in _VALUE_BLIND and any(t.numel() == 0 for t in leaves.tensors):
        raise UnsupportedOpError(f"{func} reads a tensor with no elements, which IREE 3.13 does not compute reliably")
    return False


#: Ops that use their tensor argument for its dtype and device only.
_VALUE_BLIND = {aten.new_zeros, aten.new_ones, aten.new_full, aten.zeros_like, aten.ones_like, aten.full_like}


def _layouts_of(metas: list) -> tuple:
    """(shape, dtype) of each meta result, None kept as None."""
    return tuple(None if m is None else (tuple(m.shape), m.dtype) for m in metas)


class _EmptyPlan:
    """Results with no elements: fresh allocations, no kernel."""

    def __init__(self, device: Device, layouts: tuple, kind: str) -> None:
        self.device = device
        self.layouts = layouts
        self.kind = kind
        self.structure = _STRUCTURES[kind]

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        outs = [None if layout is None else empty(*layout, self.device) for layout in self.layouts]
        return self.structure(outs)

    def record(self) -> tuple:
        return ("empty", self.layouts, self.kind)


#: How a plan puts its output tensors back into the op's result, by the kind of result.
_STRUCTURES: dict[str, Callable[[list], Any]] = {"tensor": lambda outs: outs[0], "tuple": tuple, "list": list}


def _outputs(meta_out: Any) -> tuple[list, str]:
    """The output tensors of a meta result (None kept as None) and the kind of result (_STRUCTURES)."""
    if isinstance(meta_out, torch.Tensor):
        return [meta_out], "tensor"
    if isinstance(meta_out, (tuple, list)) and all(o is None or isinstance(o, torch.Tensor) for o in meta_out):
        return list(meta_out), "list" if isinstance(meta_out, list) else "tuple"
    raise UnsupportedOpError(f"turbine cannot return {type(meta_out).__name__} results yet")


class _ViewPlan:
    """Outputs share the first input's storage with the geometry torch's meta kernel gave."""

    def __init__(self, geometries: tuple, kind: str) -> None:
        self.geometries = geometries
        self.kind = kind
        self.structure = _STRUCTURES[kind]

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        storage = leaves.tensors[0]._storage
        outs = [DeviceTensor(storage, sizes, strides, offset) for sizes, strides, offset in self.geometries]
        return self.structure(outs)

    def record(self) -> tuple:
        return ("view", self.geometries, self.kind)


def _view_plan(func: Any, leaves: Leaves, meta_out: Any) -> _ViewPlan:
    metas, kind = _outputs(meta_out)
    storage_dtype = leaves.tensors[0].dtype
    for meta in metas:
        if meta.dtype != storage_dtype:
            raise UnsupportedOpError(f"{func}: views that reinterpret {storage_dtype} as {meta.dtype} are not supported")
    geometries = tuple((tuple(m.shape), tuple(m.stride()), m.storage_offset()) for m in metas)
    for sizes, strides, offset in geometries:
        _check_in_bounds(sizes, strides, offset, leaves.tensors[0])
    return _ViewPlan(geometries, kind)


def _check_in_bounds(sizes: tuple, strides: tuple, offset: int, base: DeviceTensor) -> None:
    """A view must stay inside its storage (meta tensors do not check: their storage has no size)."""
    if any(size == 0 for size in sizes):
        return
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    if offset < 0 or last >= base._storage.numel:
        itemsize = base.element_size()
        raise RuntimeError(
            f"setStorage: sizes {list(sizes)}, strides {list(strides)}, storage offset {offset}, and itemsize "
            f"{itemsize} requiring a storage size of {(last + 1) * itemsize} are out of bounds for storage of size "
            f"{base._storage.numel * itemsize}"
        )


class _MutationPlan:
    """Ops that write their arguments: in-place (``add_``) and ``out=`` ops run their out-of-place
    twin and write its results into the targets; ops that also return results of their own
    (``_native_batch_norm_legit`` updating running statistics) run their ``_functional`` twin,
    which returns those results followed by each written argument's new value."""

    def __init__(self, func: Any, schema: OpSchema) -> None:
        self.func = func
        self.functional = functional_variant(func)
        self.appended = self.functional is None and functionalized_variant(func) is not None
        if self.appended:
            self.functional = functionalized_variant(func)
        if self.functional is None:
            raise UnsupportedOpError(f"{func} writes its arguments and has no out-of-place twin turbine can run")
        self.out_names = schema.out_names
        self.written = schema.written
        self.names = schema.names
        self.returns = len(func._schema.returns)

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        out_names = self.out_names
        call_kwargs = {k: v for k, v in kwargs.items() if k not in out_names}
        result = run(self.functional, args, call_kwargs)
        values = result if isinstance(result, (tuple, list)) else (result,)
        if out_names:
            targets = [kwargs[name] for name in out_names]
        else:
            targets = [args[i] if i < len(args) else kwargs[self.names[i]] for i in self.written]
        if self.appended:
            values, returned = values[self.returns :], tuple(values[: self.returns])
        for target, value in zip(targets, values):
            _write_result(self.func, target, value)
        if self.appended:
            return returned if self.returns > 1 else returned[0]
        if out_names:
            return targets[0] if len(targets) == 1 else tuple(targets)
        return targets[0]

    def record(self) -> tuple:
        return ("mutation",)


def _write_result(func: Any, target: DeviceTensor, value: DeviceTensor) -> None:
    if value.dtype != target.dtype:
        value = run(aten._to_copy.default, (value,), {"dtype": target.dtype})
    if tuple(value.shape) != tuple(target.shape):
        resize_out(target, value)
        return
    write(target, dense(value))


def resize_out(target: DeviceTensor, value: DeviceTensor) -> None:
    """An ``out=`` tensor of another shape than the result takes the result's shape and values, as in torch."""
    if target.numel() != 0:
        warnings.warn(
            f"An output with one or more elements was resized since it had shape {list(target.shape)}, which does "
            f"not match the required output shape {list(value.shape)}. This behavior is deprecated, and in a "
            "future PyTorch release outputs will not be resized unless they have zero elements. You can explicitly "
            "reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
            UserWarning,
            stacklevel=8,  # the user's call, above the device mode, torch's dispatch and turbine's plan
        )
    target._become(dense(value))


def _restride(func: Any, args: tuple, kwargs: dict) -> Any:
    """In-place ops that change a tensor's shape (``squeeze_``, ``t_``, ``transpose_``, ...):
    the tensor becomes the view its out-of-place twin gives."""
    target = args[0]
    target._become(run(functional_variant(func), args, kwargs))
    return target


def _resize(func: Any, args: tuple, kwargs: dict) -> Any:
    """``resize_``: contiguous over the same storage when it fits, else over a larger storage that
    starts with the old one's elements (torch keeps them too)."""
    target, sizes = args[0], tuple(args[1])
    numel = math.prod(sizes)
    storage = target._storage
    offset = target.storage_offset()
    if offset + numel > storage.numel:
        grown = empty((offset + numel,), target.dtype, storage.device)
        if storage.numel:
            old = to_host(DeviceTensor(storage, (storage.numel,)))
            write(grown[: storage.numel], to_device(old, storage.device))
        storage = grown._storage
    target._become(DeviceTensor(storage, sizes, None, offset))
    return target


class _KernelPlan:
    """One compiled kernel: dense inputs, runtime scalars as 0-d buffers, fresh dense outputs.

    ``kernel`` may still be compiling (``compiling`` is its CompilingKernel): calls until then queue
    their launches (eager/deferred.py). Should the compile fail, ``failure`` says why and calls
    go to the fallback policy.
    """

    def __init__(
        self,
        func: Any,
        device: Device,
        kernel: Kernel | CompilingKernel,
        signature: tuple,
        scalar_dtypes: list,
        layouts: tuple,
        kind: str,
    ) -> None:
        self.func = func
        self.schema = _schema(func)
        self.device = device
        self.compiling = kernel if isinstance(kernel, CompilingKernel) else None
        self.kernel = None if self.compiling else kernel
        self.failure: Exception | None = None
        #: Drops the plan from the plan cache (set by whoever stores it): see deferred.kernel_of.
        self.forget: Callable[[], None] = lambda: None
        self.signature = signature
        self.scalar_dtypes = scalar_dtypes
        self.layouts = layouts  # (shape, dtype), or None, per output
        self.outputs = [None if layout is None else DenseLayout(*layout) for layout in layouts]
        self.torch_device = torch_device(device)
        self.kind = kind
        self.structure = _STRUCTURES[kind]

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        if self.kernel is None or deferred.backlog:  # compiling, failed, or launches wait
            deferred.advance(self.device)
            if self._must_queue():
                return self._queue(leaves, args, kwargs)
            if self.failure is not None:
                return fallback.run(self.func, args, kwargs, self.failure)
        views = []
        waits = []
        for tensor in leaves.tensors:
            if not tensor._dense:
                tensor = dense(tensor)
            views.append(tensor.buffer_view())
            ready = tensor._storage.buffer.ready
            if ready is not None:
                waits.append(ready)
        if leaves.scalars:
            views += self._scalar_views(leaves)
        results = iter(self.kernel.launch(views, join(waits)))
        torch_device = self.torch_device
        return self.structure([None if layout is None else layout.make(*next(results), torch_device) for layout in self.outputs])

    def _must_queue(self) -> bool:
        """Whether this call's launch waits: its kernel is compiling, or launches wait before it.

        Takes the kernel once its compile has finished, or waits for it inside a queued launch
        (a fallback's ops run then and must not queue behind later launches).
        """
        if self.compiling is not None and (deferred.draining or self.compiling.done()):
            deferred.kernel_of(self)
        if self.failure is not None or deferred.draining:
            return False
        return self.compiling is not None or deferred.waiting(self.device)

    def _queue(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        """Queue the launch; the results are tensors over its pending buffers."""
        pending = deferred.defer(self, leaves, args, kwargs, self._scalar_views(leaves))
        torch_device = self.torch_device
        return self.structure([None if layout is None else layout.make(buffer, None, torch_device) for layout, buffer in zip(self.outputs, pending)])

    def _scalar_views(self, leaves: Leaves) -> list:
        return [scalar_view(self.device, value, dtype) for value, dtype in zip(leaves.scalars, self.scalar_dtypes)]

    def record(self) -> tuple | None:
        """None until the kernel has compiled, and for a kernel that failed: no later process
        should take such a plan without trying the kernel cache itself."""
        if self.kernel is None or self.failure is not None:
            return None
        digest = kernel_cache.digest(self.signature, self.device)
        return ("kernel", self.signature, digest, tuple(self.scalar_dtypes), self.layouts, self.kind)


def _scalar_reference(leaves: Leaves) -> torch.Tensor | None:
    """The tensor a Python number promotes against: the first non-bool device tensor, else the first."""
    for tensor in leaves.tensors:
        if tensor.dtype != torch.bool:
            return torch.empty((), dtype=tensor.dtype)
    return torch.empty((), dtype=leaves.tensors[0].dtype) if leaves.tensors else None


def _scalar_dtype(value: Any, reference: torch.Tensor | None, number: bool) -> torch.dtype:
    """A runtime scalar's dtype: a 0-d tensor keeps its own; a number the traced op takes as a
    number is 64-bit, as Python holds it; any other number takes what torch promotes it to."""
    if isinstance(value, torch.Tensor):
        return value.dtype
    if number:
        return number_dtype(value)
    if reference is None:
        return torch.tensor(value).dtype
    return torch.result_type(reference, value)


def _widen_unsigned(value: torch.Tensor) -> torch.Tensor:
    """Inside a trace: uint8 as int16 with its true values.

    IREE reads uint8 as signed (255 * 0.5 gave -0.5, 200 > 100 was false), so uint8 inputs are
    sign-extended and masked back to 0..255; results are cast back to torch's dtype, which
    wraps as uint8 arithmetic does.
    """
    if value.dtype == torch.uint8:
        return value.to(torch.int16).bitwise_and(255)
    return value


def _as_numbers(schema: OpSchema, call_args: list, call_kwargs: dict, dtype: torch.dtype) -> None:
    """Inside a trace: the runtime scalars the op takes as numbers, as ``.item()`` of their 0-d
    inputs. The trace records a symbolic number, which IREE imports as a value read at run time.

    A number crosses as 64 bits and is first converted to ``dtype`` (what the op computes its
    result in) as a tensor op: IREE may read a number on the host, whose VM cannot convert
    float64 to float32 or a float to an integer (``pad(labels, value=-100.0)`` of int64 labels).
    """
    for position, name in enumerate(schema.names):
        if name not in schema.symbolic:
            continue
        if position < len(call_args) and isinstance(call_args[position], torch.Tensor):
            call_args[position] = call_args[position].to(dtype).item()
        elif isinstance(call_kwargs.get(name), torch.Tensor):
            call_kwargs[name] = call_kwargs[name].to(dtype).item()


def _number_dtype(result_dtypes: list, values: list) -> torch.dtype:
    """The dtype a traced op's numbers are converted to: its first result's, or for a boolean
    result its first input's, in float32 where the trace computes half precision in float32."""
    candidates = [d for d in result_dtypes if d != torch.bool] + [v.dtype for v in values if v.dtype != torch.bool]
    dtype = candidates[0] if candidates else torch.float32
    return torch.float32 if dtype in _REDUCED else dtype


def _fold_alpha(func: Any, call_args: list, call_kwargs: dict) -> None:
    """add/sub's runtime ``alpha`` multiplies the operand it scales, then leaves the call."""
    if "alpha" in call_kwargs:
        alpha = call_kwargs.pop("alpha")
    elif len(call_args) > 2:
        alpha = call_args.pop(2)
    else:
        return
    scaled = 0 if func.overloadpacket.__name__ == "rsub" else 1
    call_args[scaled] = aten.mul.Tensor(call_args[scaled], alpha)


_REDUCED = (torch.bfloat16, torch.float16)


#: Ops computed in their inputs' half precision: the plain contractions, whose speed on a GPU
#: comes from half-precision math units (IREE's accumulate in float32 and round once, as torch's
#: do), and ops whose result depends on the half-precision format itself. ``addmm`` and its kin
#: are not among them: torch scales and adds the product in float32 before it rounds.
_NATIVE_PRECISION = {
    "mm", "bmm", "mv", "dot", "vdot", "matmul", "convolution", "convolution_backward", "_convolution",
    "nextafter", "frexp",
}


def _in_opmath(func: Any, leaves: Leaves) -> bool:
    """Whether a kernel computes a float16 or bfloat16 op in float32 and rounds its results once.

    torch's CPU and CUDA kernels do (their "opmath"): a sum, a norm, a cumsum or a layer norm of
    bfloat16 values accumulates in float32, and ``x * 1.7`` multiplies by 1.7, not by 1.7 rounded
    to bfloat16 (1.703125). IREE's kernels traced as they are kept bfloat16 throughout: a sum of
    256 values came out up to 0.25 off. Runtime float scalars of such kernels cross as float32.
    """
    return func.overloadpacket.__name__ not in _NATIVE_PRECISION and any(t.dtype in _REDUCED for t in leaves.tensors)


def _kernel_signature(func: Any, leaves: Leaves) -> tuple[tuple, list]:
    """The kernel cache's signature of a call, and the dtypes its runtime scalars are passed as."""
    reference = _scalar_reference(leaves) if leaves.scalars else None
    if reference is not None and reference.dtype in _REDUCED and _in_opmath(func, leaves):
        reference = torch.empty((), dtype=torch.float32)
    scalar_dtypes = [
        check_kernel_dtype(_scalar_dtype(v, reference, number), f"a scalar argument of {func}")
        for v, number in zip(leaves.scalars, leaves.numbers)
    ]
    signature = _plain(tuple(leaves.key)) + (tuple(str(d) for d in scalar_dtypes),)
    schema = _schema(func)
    if func in lowering.CORRECTIONS or schema.twin in lowering.CORRECTIONS:
        signature += ("corrected",)  # never a kernel cached from the uncorrected lowering
    return signature, scalar_dtypes


def _lowered_op(func: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    """The overload a kernel plan traces: the op, or its twin taking runtime scalars as tensors,
    unless this call compiles one of them in (pow's exponent 2: the op itself then)."""
    schema = _schema(func)
    if schema.twin is None:
        return func
    for position, name in enumerate(schema.names):
        rule = schema.runtime_scalars.get(name, False)
        if rule is True or rule is False or name in schema.symbolic:
            continue
        value = args[position] if position < len(args) else (kwargs or {}).get(name)
        if type(value) in (int, float, bool) and not is_runtime(rule, value):
            return func
    return schema.twin


def _stored_kernel_plan(func: Any, leaves: Leaves) -> _KernelPlan | None:
    """A plan from a kernel already in the cache (memory or disk), or None.

    A stored kernel's metadata holds its output layouts, so a warm process neither checks the
    call on meta tensors again nor traces it: a kernel exists only for calls that passed both.
    """
    if any(t.numel() == 0 for t in leaves.tensors):
        return None  # _zero_size decides these, from the meta call
    signature, scalar_dtypes = _kernel_signature(func, leaves)
    kernel = kernel_cache.stored(signature, leaves.device)
    if kernel is None or "outputs" not in kernel.metadata:
        return None
    layouts = tuple(None if o is None else (tuple(o[0]), getattr(torch, o[1])) for o in kernel.metadata["outputs"])
    return _KernelPlan(func, leaves.device, kernel, signature, scalar_dtypes, layouts, kernel.metadata["structure"])


def _kernel_plan(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, meta_out: Any) -> _KernelPlan:
    device = leaves.device
    metas, kind = _outputs(meta_out)
    for meta in metas:
        if meta is not None:
            check_kernel_dtype(meta.dtype, f"the result of {func}")
    for tensor in leaves.tensors:
        check_kernel_dtype(tensor.dtype, f"an input of {func}")
    signature, scalar_dtypes = _kernel_signature(func, leaves)
    inputs = [(tuple(t.shape), t.dtype) for t in leaves.tensors] + [((), d) for d in scalar_dtypes]
    target = _lowered_op(func, args, kwargs)
    target = lowering.CORRECTIONS.get(target, target)
    count = len(leaves.tensors)

    result_dtypes = [m.dtype for m in metas if m is not None]

    opmath = _in_opmath(func, leaves)

    def traced(*values: torch.Tensor) -> list[torch.Tensor]:
        values = [_widen_unsigned(v) for v in values]
        if opmath:
            values = [v.to(torch.float32) if v.dtype in _REDUCED else v for v in values]
        tensors = iter(values[:count])
        scalars = iter(values[count:])
        call_args, call_kwargs = rebuild(schema, args, kwargs, lambda _: next(tensors), lambda _: next(scalars))
        call_kwargs = {name: _host_devices(value, "cpu") for name, value in call_kwargs.items()}
        if schema.symbolic:
            _as_numbers(schema, call_args, call_kwargs, _number_dtype(result_dtypes, values[:count]))
        if "alpha" in schema.runtime_scalars and "alpha" not in schema.symbolic:
            _fold_alpha(func, call_args, call_kwargs)
        out = target(*call_args, **call_kwargs)
        outs = [o for o in ([out] if isinstance(out, torch.Tensor) else out) if o is not None]
        return [o if o.dtype == d else o.to(d) for o, d in zip(outs, result_dtypes)]

    result_shapes = [tuple(m.shape) for m in metas if m is not None]

    def checked(*values: torch.Tensor) -> list[torch.Tensor]:
        """traced, refusing results whose shapes are not the meta call's: torch's shape rule and
        its kernel disagree for some ops (native_batch_norm in eval mode: [C] against [0]), and
        then only the fallback gives torch's results."""
        outs = traced(*values)
        shapes = [tuple(o.shape) for o in outs]
        if shapes != result_shapes:
            raise CompileError(f"the lowering gives results of shapes {shapes}, torch's shape rule {result_shapes}")
        return outs

    def traced_as_1d(*values: torch.Tensor) -> list[torch.Tensor]:
        """0-d tensor inputs as 1-element 1-d ones: IREE 3.13 cannot lower some reductions of 0-d
        tensors (amax, argmax, max.dim), and with dim 0 or -1 the op means the same on both."""
        values = [v.reshape(1) if i < count and v.dim() == 0 else v for i, v in enumerate(values)]
        return [o.reshape(shape) for o, shape in zip(traced(*values), result_shapes)]

    # The op as it is first; then torch's decompositions of it, where torch has some; then, for
    # 0-d inputs, the op on 1-d ones.
    lowerings = [
        lambda: lowering.lower(checked, inputs),
        lambda: lowering.lower(checked, inputs, decompose=True) if func in lowering.decompositions() else _no_lowering(),
    ]
    if any(t.dim() == 0 for t in leaves.tensors):
        lowerings.append(lambda: lowering.lower(traced_as_1d, inputs))
    metadata = {
        "outputs": [None if m is None else [list(m.shape), str(m.dtype).replace("torch.", "")] for m in metas],
        "structure": kind,
    }
    if deferred.enabled() and func not in _SHAPE_RULE_DIFFERS:
        lowering.prepare()
        kernel = kernel_cache.start(signature, device, lowerings, _describe(func, leaves), metadata)
    else:
        kernel = kernel_cache.kernel(signature, device, lowerings, _describe(func, leaves), metadata)
    return _KernelPlan(func, device, kernel, signature, scalar_dtypes, _layouts_of(metas), kind)


#: Ops whose results torch's shape rule gives other shapes than its kernel (embedding_bag's
#: offset2bag in sum mode: [N] against [0]; batch norm's are routed by eager/batch_norm.py). Their kernels compile in the foreground: the lowering is refused (``checked``)
#: before the op hands out tensors of the rule's shapes. Found by the OpInfo coverage run.
_SHAPE_RULE_DIFFERS = {
    aten._embedding_bag.default,
    aten._embedding_bag_forward_only.default,
}


def _no_lowering() -> str:
    raise CompileError("torch has no decomposition for this op")


# --- ops handled before planning --------------------------------------------------------------


def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    source = args[0]
    target = kwargs.get("device")
    dtype = kwargs.get("dtype") or source.dtype
    if target is None or (target.type == "turbine" and target.index == source._storage.device.index):
        same = {k: v for k, v in kwargs.items() if k != "device"}
        return _plan_and_run(func, args, same)
    host_copy = to_host(source).to(dtype)
    if target.type == "cpu":
        return host_copy
    if target.type == "turbine":
        return to_device(host_copy, by_index(target.index))
    raise RuntimeError(f"turbine cannot copy a tensor to {target}; copy it to the CPU first (.cpu())")


def _copy_(func: Any, args: tuple, kwargs: dict) -> Any:
    destination, source = args[0], args[1]
    if not isinstance(destination, DeviceTensor):
        return destination.copy_(to_host(source))
    device = destination._storage.device
    if not isinstance(source, DeviceTensor):
        # Host data: cast and broadcast on the host, upload once, write in place.
        values = torch.as_tensor(source).to(destination.dtype).expand(destination.shape)
        write(destination, to_device(values, device))
        return destination
    if source._storage.device is not device:
        source = to_device(to_host(source), device)
    return _plan_and_run(func, (destination, source) + tuple(args[2:]), kwargs)


def _index(func: Any, args: tuple, kwargs: dict) -> Any:
    """Indexing accepts CPU index tensors (as on CUDA): they are uploaded to the indexed device."""
    device = args[0]._storage.device if isinstance(args[0], DeviceTensor) else None
    indices = args[1]
    if device is not None and any(type(i) is torch.Tensor and i.dim() > 0 for i in indices):
        indices = [to_device(i, device) if type(i) is torch.Tensor and i.dim() > 0 else i for i in indices]
        args = (args[0], indices) + tuple(args[2:])
    if func is not aten.index.Tensor and any(masked.is_mask(i) for i in indices):
        result = masked.as_select(func, args, kwargs)
        if result is not None:
            return result
        reason = UnsupportedOpError(f"{func} with a boolean mask crashes IREE 3.13's kernel")
        return fallback.run(func, args, kwargs, reason)
    return _plan_and_run(func, args, kwargs)


def _cat(func: Any, args: tuple, kwargs: dict) -> Any:
    """``cat`` leaving out inputs with no elements: torch skips 1-D empty ones (a key-value cache
    before its first token) and the others add nothing, and IREE is not to be trusted with empty
    tensors (``_zero_size``). torch's shape rule still checks the whole call."""
    tensors = args[0]
    kept = [t for t in tensors if t.numel() != 0]
    if len(kept) == len(tensors) or not kept:
        return _plan_and_run(func, args, kwargs)
    meta = _meta_call(func, _schema(func), args, kwargs)
    result = run(func, (kept, *args[1:]), kwargs) if len(kept) > 1 else run(aten.clone.default, (kept[0],), {})
    if result.dtype != meta.dtype:
        result = run(aten._to_copy.default, (result,), {"dtype": meta.dtype})
    return result


def _item(func: Any, args: tuple, kwargs: dict) -> Any:
    return to_host(args[0]).item()


def _equal(func: Any, args: tuple, kwargs: dict) -> bool:
    """``torch.equal``: same sizes and values (NaN unequal), decided on the device; the host
    reads one bool, as torch's own CUDA kernel does."""
    a, b = args
    if a.shape != b.shape:
        return False
    return bool(_item(func, (run(aten.all.default, (run(aten.eq.Tensor, (a, b), {}),), {}),), {}))


def _allclose(func: Any, args: tuple, kwargs: dict) -> bool:
    """``torch.allclose`` as isclose(...).all() on the device; the host reads one bool."""
    close = run(aten.isclose.default, args, kwargs)
    return bool(_item(func, (run(aten.all.default, (close,), {}),), {}))


def _factoring_the_transpose(func: Any, args: tuple, kwargs: dict) -> Any:
    """``_linalg_det`` and ``_linalg_slogdet`` return the LU factors of A^T for a contiguous A and
    of A otherwise, and their backward reads them that way; turbine's kernels factor A^T, so
    other layouts go to the fallback policy."""
    if args[0].is_contiguous():
        return _plan_and_run(func, args, kwargs)
    reason = UnsupportedOpError(f"{func} of a non-contiguous matrix factors A itself, which turbine's kernel does not")
    return fallback.run(func, args, kwargs, reason)


def _check_errors(func: Any, args: tuple, kwargs: dict) -> None:
    """linalg's error check (``info`` of a factorization): the host reads info, as torch's CUDA
    backend does, and torch's CPU op raises torch's own message for a nonzero one."""
    info, *rest = args
    func(to_host(info), *rest, **kwargs)


def _empty(func: Any, args: tuple, kwargs: dict) -> Any:
    """Uninitialised tensors: a fresh buffer, no kernel."""
    schema = schema_of(func)
    leaves = walk(func, schema, args, kwargs)
    meta = _meta_call(func, schema, args, kwargs)
    return empty(tuple(meta.shape), meta.dtype, leaves.device)


def _random(func: Any, args: tuple, kwargs: dict) -> Any:
    """Random ops draw from torch's CPU generator, so seeds give torch's CPU numbers."""
    counters.host_ops[str(func)] += 1
    return host.run_on_host(func, args, kwargs, host.device_of(args, kwargs))


def _native_dropout(func: Any, args: tuple, kwargs: dict) -> Any:
    """Dropout with the noise torch's CPU dropout draws, so a seed gives torch's CPU numbers.

    torch's CPU kernel fills a tensor shaped like the input with ``bernoulli_(1 - p)`` from its
    CPU generator, divides it by ``1 - p`` and multiplies; the noise is drawn the same way on the
    host (one upload) and the arithmetic runs as kernels.
    """
    input, p = args[0], args[1]
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if train is False or p == 0:
        return torch._decomp.decomposition_table[func](*args, **kwargs)
    counters.host_ops[str(func)] += 1
    keep = 1.0 - p
    noise = torch.empty(tuple(input.shape), dtype=input.dtype).bernoulli_(keep)
    device_noise = to_device(noise, input._storage.device)
    mask = device_noise != 0
    if keep == 0:
        return input * torch.zeros((), dtype=input.dtype, device=input.device), mask
    return input * (device_noise / keep), mask


_RANDOM = [
    "uniform_.default", "normal_.default", "bernoulli_.float", "bernoulli_.Tensor", "bernoulli.default",
    "bernoulli.p", "random_.default", "random_.from", "random_.to", "exponential_.default", "geometric_.default",
    "log_normal_.default", "cauchy_.default", "rand_like.default", "randn_like.default", "randint_like.default",
    "randint_like.low_dtype", "multinomial.default", "normal.Tensor_float", "normal.float_Tensor",
    "normal.Tensor_Tensor", "poisson.default",
]
_EMPTY = ["empty_like.default", "new_empty.default", "new_empty_strided.default", "empty.memory_format"]


def _resolve(name: str) -> Any:
    packet, overload = name.split(".")
    return getattr(getattr(aten, packet), overload)


_RESTRIDE = [
    "squeeze_.default", "squeeze_.dim", "squeeze_.dims", "unsqueeze_.default", "t_.default", "transpose_.default",
    "as_strided_.default",
]

def _lazy_view_as_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    """torch's lazy conjugate and negative views (``x.conj()`` of a complex tensor) as copies.

    A turbine tensor has no conjugate or negative bit, so such a view holds the values it shows;
    it does not alias its base, which no turbine op needs, but a view made that way would silently
    drop the conjugation.
    """
    physical = aten.conj_physical.default if func is aten._conj.default else aten.neg.default
    return run(physical, args, kwargs)


SPECIAL: dict[Any, Callable] = {
    aten.resize_.default: _resize,
    aten._conj.default: _lazy_view_as_copy,
    aten._neg_view.default: _lazy_view_as_copy,
    **{_resolve(name): _restride for name in _RESTRIDE},
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _item,
    aten._linalg_check_errors.default: _check_errors,
    aten._linalg_det.default: _factoring_the_transpose,
    aten._linalg_slogdet.default: _factoring_the_transpose,
    aten.equal.default: _equal,
    aten.allclose.default: _allclose,
    aten.index.Tensor: _index,
    aten.cat.default: _cat,
    aten.index_put.default: _index,
    aten.index_put_.default: _index,
    aten._index_put_impl_.default: _index,
    aten.native_dropout.default: _native_dropout,
    aten.native_batch_norm.default: batch_norm.native_batch_norm,
    aten._batch_norm_with_update.default: batch_norm.batch_norm_with_update,
    aten._batch_norm_no_update.default: batch_norm.batch_norm_no_update,
    **{_resolve(name): _random for name in _RANDOM},
    **{_resolve(name): _empty for name in _EMPTY},
}
