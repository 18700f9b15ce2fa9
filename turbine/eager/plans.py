"""The kinds of plan an op call runs by, except the kernel plan (eager/kernel_plan.py).

A plan is built once per key (eager/planning.py) and called with each call's leaves and
arguments. Each plan's ``record()`` describes it for eager/saved_plans.py, so a new process
takes a key's plan from disk instead of building it again.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from turbine.counters import counters
from turbine.device import Device
from turbine.eager import fallback, host, runtime
from turbine.eager.executors import Executor
from turbine.eager.meta import raise_as_torch_cpu
from turbine.eager.schema import OpSchema, as_call, bound_arguments, functional_variant, functionalized_variant
from turbine.eager.signature import Leaves
from turbine.eager.tensor import DeviceTensor, ReinterpretedStorage, Storage, ViewLayout, dense_in_order, empty, torch_device
from turbine.eager.transfer import to_device
from turbine.eager.views import dense, write, write_resized
from turbine.errors import UnsupportedLayoutError, UnsupportedOpError, detached

aten = torch.ops.aten


class FallbackPlan:
    """An op IREE cannot run: every call goes to the fallback policy in force at that call."""

    def __init__(self, func: Any, reason: Exception, device: Device | None) -> None:
        self.func = func
        self.reason = detached(reason)  # kept for every later call: no frames with it
        self.device = device

    @property
    def executor(self) -> Executor | None:
        """The executor the calling thread's policy chooses now (None: the op raises)."""
        return fallback.choose(self.func, self.device, runtime.state.fallback_policy)

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        return fallback.run(self.func, args, kwargs, self.reason)

    def record(self) -> None:
        return None  # decided again in each process (the kernel cache remembers a failed compile)


class SharePlan:
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


def layouts_of(metas: list) -> tuple:
    """(shape, dtype) of each meta result, None kept as None."""
    return tuple(None if m is None else (tuple(m.shape), m.dtype) for m in metas)


class EmptyPlan:
    """Results with no elements: fresh allocations, no kernel."""

    def __init__(self, device: Device, layouts: tuple, kind: str) -> None:
        self.device = device
        self.layouts = layouts
        self.kind = kind
        self.structure = STRUCTURES[kind]

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        outs = [None if layout is None else empty(*layout, self.device) for layout in self.layouts]
        return self.structure(outs)

    def record(self) -> tuple:
        return ("empty", self.layouts, self.kind)


class NothingReadPlan:
    """A call whose tensor arguments all have no elements but whose results do: the sum of
    nothing is 0, its mean NaN, whatever the device. The results depend on the arguments' shapes
    and dtypes alone, so torch's CPU kernel computes them from empty host tensors of the same
    shapes (nothing is downloaded, nor waited for) and they are uploaded; IREE 3.13 was not to
    be trusted with the empty reductions (the std of nothing came out as a number). Counted as a
    host op."""

    def __init__(self, func: Any) -> None:
        self.func = func

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        counters.host_ops[str(self.func)] += 1
        device = leaves.device

        def stand_in(tensor: DeviceTensor, written: bool) -> torch.Tensor:
            return torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype)

        def bring_back(result: torch.Tensor) -> DeviceTensor:
            return to_device(result.contiguous(), device)

        return host.run_with_torch(self.func, args, kwargs, stand_in, bring_back, torch.device("cpu"))

    def record(self) -> tuple:
        return ("nothing read",)


#: How a plan puts its output tensors back into the op's result, by the kind of result.
STRUCTURES: dict[str, Callable[[list], Any]] = {"tensor": lambda outs: outs[0], "tuple": tuple, "list": list}


def outputs(meta_out: Any, func: Any) -> tuple[list, str]:
    """The output tensors of ``func``'s meta result (None kept as None) and the kind of result (STRUCTURES).

    A sparse result is refused here, at once: no executor can make one that a turbine device
    holds, so it does not go to the fallback policy (dispatch raises it as it is)."""
    if isinstance(meta_out, torch.Tensor):
        metas, kind = [meta_out], "tensor"
    elif isinstance(meta_out, (tuple, list)) and all(o is None or isinstance(o, torch.Tensor) for o in meta_out):
        metas, kind = list(meta_out), "list" if isinstance(meta_out, list) else "tuple"
    else:
        raise UnsupportedOpError(f"turbine cannot return {type(meta_out).__name__} results yet")
    for meta in metas:
        if meta is not None and meta.layout != torch.strided:
            raise UnsupportedLayoutError(func, meta.layout)
    return metas, kind


class ViewPlan:
    """Outputs share the first input's storage with the geometry torch's meta kernel gave; with
    ``dtype``, a complex storage seen as real numbers or the reverse (``view_as_real``)."""

    def __init__(self, geometries: tuple, kind: str, dtype: torch.dtype | None = None) -> None:
        self.geometries = geometries
        self.kind = kind
        self.structure = STRUCTURES[kind]
        self.dtype = dtype
        self.layouts: list[ViewLayout] = []  # the geometries' layouts, made by the first call

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        storage = leaves.tensors[0]._storage
        if self.dtype is not None:
            storage = ReinterpretedStorage(storage, self.dtype)
        layouts = self.layouts
        if not layouts or layouts[0].storage_numel != storage.numel:
            layouts = self.layouts = [ViewLayout(*g, storage.numel, storage.dtype) for g in self.geometries]
        device = torch_device(storage.device)
        return self.structure([layout.make(storage, device) for layout in layouts])

    def record(self) -> tuple:
        return ("view", self.geometries, self.kind, self.dtype)


class MutationPlan:
    """Ops that write their arguments: in-place (``add_``) and ``out=`` ops run their out-of-place
    twin and write its results into the targets; ops that also return results of their own
    (``_native_batch_norm_legit`` updating running statistics) run their ``_functional`` twin,
    which returns those results followed by each written argument's new value."""

    def __init__(self, func: Any, schema: OpSchema, run: Callable[[Any, tuple, dict], Any]) -> None:
        self.func = func
        self.run = run  # dispatch's run: the twin goes through its own plan
        self.functional = functional_variant(func)
        self.appended = self.functional is None and functionalized_variant(func) is not None
        if self.appended:
            self.functional = functionalized_variant(func)
        if self.functional is None:
            raise UnsupportedOpError(f"{func} writes its arguments and has no out-of-place twin turbine can run")
        self.out_names = schema.out_names
        #: The twin takes the same arguments in another order (``polygamma(n, self)``): passed by name.
        self.reordered = [a.name for a in self.functional._schema.arguments] != [n for n in schema.names if n not in schema.out_names]
        self.written = schema.written
        self.names = schema.names
        self.returns = len(func._schema.returns)
        self.schema = schema
        self.fits = False  # whether results were checked to fit their tensors (dtypes are the plan's)
        #: torch refuses an input that partly shares the written tensor's memory in its elementwise
        #: ops and copies (TensorIterator's check) and index_put_; its other ops differ, some
        #: writing without a check (``sum(out=)``, ``mm(out=)``).
        self.checks_overlap = torch.Tag.pointwise in func.tags or func in _OVERLAP_CHECKED

    def __call__(self, leaves: Leaves, args: tuple, kwargs: dict) -> Any:
        out_names = self.out_names
        if out_names:
            targets = [kwargs[name] for name in out_names]
        else:
            targets = [args[i] if i < len(args) else kwargs[self.names[i]] for i in self.written]
        for target in targets:
            _check_no_internal_overlap(target)
            if self.checks_overlap:
                _check_no_partial_overlap(target, leaves.tensors)
        call_kwargs = {k: v for k, v in kwargs.items() if k not in out_names}
        given = args, kwargs
        if self.reordered:
            named = {k: v for k, v in bound_arguments(self.func, args, kwargs).items() if k not in out_names}
            args, call_kwargs = as_call(self.functional, named)
        result = self.run(self.functional, args, call_kwargs)
        values = result if isinstance(result, (tuple, list)) else (result,)
        if self.appended:
            values, returned = values[self.returns :], tuple(values[: self.returns])
        if not out_names and not self.fits:
            self._check_castable(targets, values, *given)
            self.fits = True
        for target, value in zip(targets, values):
            if isinstance(target, (list, tuple)):  # a written list (GradScaler's unscale of the gradients)
                for each, new in zip(target, value, strict=True):
                    write_result(self.func, each, new)
            else:
                write_result(self.func, target, value)
        if self.returns == 0:
            return None  # it writes and returns nothing (GradScaler's _amp_foreach_non_finite_check_and_unscale_)
        if self.appended:
            return returned if self.returns > 1 else returned[0]
        if out_names:
            return targets[0] if len(targets) == 1 else tuple(targets)
        return targets[0]

    def _check_castable(self, targets: list, values: tuple, args: tuple, kwargs: dict) -> None:
        """torch's check that an in-place op's result fits its tensor (``long.mul_(0.5)``: "result
        type Float can't be cast to the desired output type Long"), which some of torch's meta
        rules (mul_, addcmul_, lerp_, hypot_) leave to the kernel: the result was truncated."""
        for target, value in zip(targets, values):
            if isinstance(target, torch.Tensor) and not torch.can_cast(value.dtype, target.dtype):
                raise_as_torch_cpu(self.func, self.schema, args, kwargs)
                raise RuntimeError(f"result type {value.dtype} can't be cast to the desired output type {target.dtype}")

    def record(self) -> tuple:
        return ("mutation",)


def _check_no_internal_overlap(target: Any) -> None:
    """torch's check on a tensor an op writes: no two of its elements may share memory (an
    expanded view's), or the result would depend on the order of the writes. A tensor with no
    elements has none to share (torch writes an empty expanded view without complaint)."""
    if not isinstance(target, DeviceTensor) or target.numel() == 0:
        return
    if any(size > 1 and stride == 0 for size, stride in zip(target.shape, target.stride())):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single memory "
            "location. Please clone() the tensor before performing the operation."
        )


_OVERLAP_CHECKED = (aten.copy_.default, aten.index_put_.default, aten._index_put_impl_.default)


def _check_no_partial_overlap(target: Any, inputs: list) -> None:
    """torch's check that no input shares part of a written tensor's memory (``y[1:].copy_(y[:-1])``,
    ``y.add_(y.t())``): torch's result would depend on the order of its reads and writes, where
    turbine reads every input first. The same tensor, or a view of the same elements in the same
    order, is fine; so is any pair torch's check finds too hard (one not dense, ``expand``'s)."""
    if not isinstance(target, DeviceTensor) or target.numel() == 0:
        return
    for input in inputs:
        if input is target or input._storage is not target._storage or input.numel() == 0:
            continue
        if not (dense_in_order(tuple(target.shape), target.stride()) and dense_in_order(tuple(input.shape), input.stride())):
            continue
        begin, end = _byte_range(target)
        input_begin, input_end = _byte_range(input)
        same = begin == input_begin and end == input_end and target.stride() == input.stride()
        if input_begin < end and begin < input_end and not same:
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
                "memory location. Please clone() the tensor before performing the operation."
            )


def _byte_range(tensor: DeviceTensor) -> tuple[int, int]:
    """Where a dense tensor's elements start and end in its storage, in bytes."""
    begin = tensor.storage_offset() * tensor.element_size()
    return begin, begin + tensor.numel() * tensor.element_size()


def write_result(func: Any, target: DeviceTensor, value: DeviceTensor) -> None:
    if value.dtype != target.dtype:
        value = aten._to_copy.default(value, dtype=target.dtype)
    if tuple(value.shape) != tuple(target.shape):
        resize_out(target, value)
        return
    write(target, value)


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
    write_resized(target, value)
