"""Building the plan for a new key: from a saved record, a stored kernel, or the meta call.

In order: an op that writes its arguments gets a mutation plan; one that returns a view of its
input, a view plan; a call whose results are all empty, fresh allocations; one that reads only
empty tensors, torch's results from their shapes; an elementwise op on inputs in another memory
order than row-major, the op in that order (eager/ordered_plan.py); a copy of a dense
input, a new storage over its buffer; anything else, a kernel (eager/op_trace.py), which for a
call the vendor executor can run too goes inside a timed plan (eager/timed_plan.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.counters import counters
from turbine.eager import executors, kernel_orders, registry
from turbine.eager.kernel_plan import KernelPlan
from turbine.eager.meta import meta_call
from turbine.eager.op_trace import kernel_plan, lowered_as_now, stored_kernel_plan
from turbine.eager.ordered_plan import OrderedPlan, may_keep_order, order_kept
from turbine.eager.plans import EmptyPlan, MutationPlan, NothingReadPlan, SharePlan, ViewPlan, layouts_of, outputs
from turbine.eager.relaid_plan import RelaidPlan, relaid_strides
from turbine.eager.schema import OpSchema
from turbine.eager.signature import Leaves
from turbine.eager.tensor import contiguous_strides
from turbine.eager.timed_plan import TimedPlan
from turbine.errors import CompileError, UnsupportedOpError
from turbine.kernels_cache import kernel_cache


def from_record(func: Any, schema: OpSchema, leaves: Leaves, record: tuple, run: Callable) -> Callable | None:
    """The plan a saved record describes (the plans' ``record`` methods), or None when its
    kernel is no longer in the kernel cache."""
    kind = record[0]
    if kind == "relaid":
        inner = from_record(func, schema, leaves, record[2], run)
        return None if inner is None else RelaidPlan(inner, record[1], run)
    if kind == "kernel":
        _, signature, digest, scalar_dtypes, layouts, structure, orders, out_orders = record
        if not lowered_as_now(func, signature):
            return None  # turbine's lowering of the op changed since: built again, with a new kernel
        kernel = kernel_cache.stored(signature, leaves.device, digest)
        if kernel is None:
            return None
        plan: Callable = _timed_if_claimed(
            func, leaves, KernelPlan(func, leaves.device, kernel, signature, list(scalar_dtypes), layouts, structure, orders, out_orders)
        )
    elif kind == "view":
        plan = ViewPlan(*record[1:])
    elif kind == "mutation":
        plan = MutationPlan(func, schema, run)
    elif kind == "share":
        if not _shares_here(func, leaves):
            return None
        plan = SharePlan(record[1])
    elif kind == "ordered":
        plan = OrderedPlan(func, record[1], run)
    elif kind == "nothing read":
        plan = NothingReadPlan(func)
    else:
        plan = EmptyPlan(leaves.device, record[1], record[2])
    counters.plans_from_disk += 1
    return plan


def build_plan(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, run: Callable) -> Callable:
    """A new plan for a call: a stored kernel's, else from the meta call, by what the op does.

    ``run`` is dispatch's: a mutation plan runs the op's out-of-place twin through it."""
    if leaves.device is None:
        raise UnsupportedOpError(f"{func} reached turbine without a turbine tensor argument")
    if not schema.written and not schema.aliased_output and not may_keep_order(func, leaves) and not kernel_orders.reads_another_order(leaves):
        plan = stored_kernel_plan(func, leaves)
        if plan is not None:
            return _timed_if_claimed(func, leaves, plan)
    meta_out = meta_call(func, schema, args, kwargs)
    if schema.written:
        return MutationPlan(func, schema, run)
    if schema.aliased_output:
        return _view_plan(func, leaves, meta_out)
    metas, kind = outputs(meta_out, func)
    if _zero_size(metas):
        return EmptyPlan(leaves.device, layouts_of(metas), kind)
    if any(t.numel() == 0 for t in leaves.tensors) and not registry.has_trait(func, "value_blind"):
        return _reading_nothing(func, leaves, metas)
    order = order_kept(func, leaves, meta_out)
    if order is not None:
        return OrderedPlan(func, order, run)
    if _shares_buffer(func, leaves, metas) and _shares_here(func, leaves):
        return SharePlan(tuple(metas[0].shape))
    plan = _computing_plan(func, schema, args, kwargs, leaves, meta_out)
    strides = relaid_strides(func, leaves, metas)
    return plan if strides is None else RelaidPlan(plan, strides, run)


def _computing_plan(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, meta_out: Any) -> Callable:
    """The plan of a call that computes new values: IREE's kernel, timed against the vendor's
    where the vendor executor competes for the call."""
    if not _vendor_claims(func, leaves):
        return kernel_plan(func, schema, args, kwargs, leaves, meta_out)
    try:
        return TimedPlan(func, leaves.device, kernel_plan(func, schema, args, kwargs, leaves, meta_out))
    except (CompileError, UnsupportedOpError) as reason:
        return TimedPlan(func, leaves.device, None, reason)


def _vendor_claims(func: Any, leaves: Leaves) -> bool:
    """Whether the vendor executor competes with IREE's kernel for this call (executors/vendor.py)."""
    return executors.VENDOR.claims(func, leaves.device, [t.dtype for t in leaves.tensors])


def _timed_if_claimed(func: Any, leaves: Leaves, plan: KernelPlan) -> Callable:
    """A kernel plan, inside a timed plan where the vendor executor competes for the call."""
    return TimedPlan(func, leaves.device, plan) if _vendor_claims(func, leaves) else plan


def _shares_buffer(func: Any, leaves: Leaves, metas: list) -> bool:
    """Whether the result can be a new storage over the buffer of its input's elements: turbine
    never writes into a buffer once made (device/buffer.py), so sharing one is as good as a copy."""
    if not registry.has_trait(func, "same_elements") or len(leaves.tensors) != 1 or len(metas) != 1 or metas[0] is None:
        return False
    out = metas[0]
    return out.dtype == leaves.tensors[0].dtype and out.stride() == contiguous_strides(tuple(out.shape))


def _shares_here(func: Any, leaves: Leaves) -> bool:
    """Whether a copy of the input shares its buffer on this device: always for a dense input; a
    view that is not dense needs a gather, which the vendor executor competes for where it runs
    (so that torch's strided views, attention's transposes, are not handed to IREE and back)."""
    return leaves.tensors[0]._dense or not _vendor_claims(func, leaves)


def _zero_size(metas: list) -> bool:
    """Whether every result has no elements (so no kernel is needed).

    IREE 3.13 is not to be trusted with empty tensors: its compiler crashes on some views of them
    (a division by zero in torch-mlir), and kernels reducing an empty tensor gave wrong values
    (the std of nothing came out as a number, not NaN). Calls whose results are all empty run no
    kernel; calls that read an empty tensor into a non-empty result do not run IREE's kernel
    either (:func:`_reading_nothing`), except those that never read their input's values
    (``new_zeros`` and friends).
    """
    outputs = [m for m in metas if m is not None]
    return bool(outputs) and all(m.numel() == 0 for m in outputs)


def _reading_nothing(func: Any, leaves: Leaves, metas: list) -> Callable:
    """The plan of a call that reads an empty tensor into results with elements (IREE 3.13 is
    not to be trusted with it: :func:`_zero_size`). Where every tensor argument is empty, the
    results follow from the shapes alone (:class:`NothingReadPlan`); a scatter of an empty index
    (``writes_by_index``) gives its first argument as it is, a new storage over its buffer. Any other call (an addmm of an empty
    inner dim onto a bias) or an op that draws random numbers goes to the fallback policy."""
    if all(t.numel() == 0 for t in leaves.tensors) and torch.Tag.nondeterministic_seeded not in func.tags:
        return NothingReadPlan(func)
    first, result = leaves.tensors[0], metas[0]
    if registry.has_trait(func, "writes_by_index") and first.numel() and (result.shape, result.dtype) == (first.shape, first.dtype):
        return SharePlan(tuple(result.shape))
    raise UnsupportedOpError(f"{func} reads a tensor with no elements, which IREE 3.13 does not compute reliably")


def _view_plan(func: Any, leaves: Leaves, meta_out: Any) -> ViewPlan:
    metas, kind = outputs(meta_out, func)
    storage_dtype = leaves.tensors[0]._storage.dtype
    reinterpreted = None
    for meta in metas:
        if meta.dtype != storage_dtype:
            if _REAL_OF.get(meta.dtype) is not storage_dtype and _REAL_OF.get(storage_dtype) is not meta.dtype:
                raise UnsupportedOpError(f"{func}: views that reinterpret {storage_dtype} as {meta.dtype} are not supported")
            reinterpreted = meta.dtype  # view_as_real, view_as_complex: the same memory in other units
    numel = leaves.tensors[0]._storage.numel * storage_dtype.itemsize // (reinterpreted or storage_dtype).itemsize
    geometries = tuple((tuple(m.shape), tuple(m.stride()), m.storage_offset()) for m in metas)
    for sizes, strides, offset in geometries:
        _check_in_bounds(sizes, strides, offset, numel, (reinterpreted or storage_dtype).itemsize)
    return ViewPlan(geometries, kind, reinterpreted)


#: A complex dtype's real part's dtype, and the reverse.
_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _check_in_bounds(sizes: tuple, strides: tuple, offset: int, numel: int, itemsize: int) -> None:
    """A view must stay inside its storage of ``numel`` elements (meta tensors do not check:
    their storage has no size)."""
    if any(size == 0 for size in sizes):
        return
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    if offset < 0 or last >= numel:
        raise RuntimeError(
            f"setStorage: sizes {list(sizes)}, strides {list(strides)}, storage offset {offset}, and itemsize "
            f"{itemsize} requiring a storage size of {(last + 1) * itemsize} are out of bounds for storage of size "
            f"{numel * itemsize}"
        )
