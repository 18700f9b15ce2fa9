"""An op call's kernel: its signature in the kernel cache, and its kernel plan.

The signature holds what a kernel compiles in (the op, each input's sizes and dtype, constants,
the dtypes runtime scalars cross as); the plan takes the kernel from the cache or compiles it from
the traced call (eager/traced_call.py), with dynamic dims where the op's family has them
(eager/dynamic.py). A call with a size of 1 at a dynamic dim runs on the family's kernel only
where its program is the same at 1 (kernels_cache/program_match.py).
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager import deferred, dynamic, lowering, registry
from turbine.eager.decompositions import accumulation
from turbine.eager.dtypes import check_kernel_dtype
from turbine.eager.kernel_orders import Orders, in_orders, input_orders, output_orders, permute_sizes, written_sizes
from turbine.eager.kernel_plan import KernelPlan
from turbine.eager.plans import outputs
from turbine.eager.scalars import number_dtype
from turbine.eager.schema import OpSchema, schema_of
from turbine.eager.signature import Leaves
from turbine.eager.traced_call import AS_IT_IS, DECOMPOSED, REDUCED, in_opmath, kernel_function, lowerings_of
from turbine.errors import CompileError
from turbine.kernels_cache import Kernel, kernel_cache, program_match
from turbine.kernels_cache.tracing import Dynamic, SymbolsMustMatch


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


def _kernel_signature(func: Any, leaves: Leaves, orders: Orders | None = None, out_orders: Orders | None = None) -> tuple[tuple, list]:
    """The kernel cache's signature of a call, and the dtypes its runtime scalars are passed as;
    with the memory orders its kernel reads inputs and writes results in (eager/kernel_orders.py)."""
    reference = _scalar_reference(leaves) if leaves.scalars else None
    if reference is not None and reference.dtype in REDUCED and in_opmath(func, leaves):
        reference = torch.empty((), dtype=torch.float32)
    scalar_dtypes = [
        check_kernel_dtype(_scalar_dtype(v, reference, number), f"a scalar argument of {func}")
        for v, number in zip(leaves.scalars, leaves.numbers)
    ]
    key = list(leaves.key)
    for i, (slot, tensor) in enumerate(zip(_tensor_slots(leaves), leaves.tensors)):
        key[slot] = tensor._key[:2]  # sizes and dtype: the kernel takes every input dense
        if orders is not None and orders[i] is not None:
            key[slot] = (permute_sizes(tuple(tensor.shape), orders[i]), tensor.dtype, "in order", orders[i])
    if out_orders is not None:
        key.append(("results in order", out_orders))
    signature = _plain(tuple(key)) + (tuple(str(d) for d in scalar_dtypes),)
    # turbine's own lowering, as it is now: never a kernel (or a failure) cached from another
    return signature + lowering_of(func), scalar_dtypes


def lowering_of(func: Any) -> tuple[str, ...]:
    """The digests that end ``func``'s kernel signatures: of turbine's own lowerings of ``func``
    and its Scalar twin (where it has one), then of all corrections, which any kernel may trace."""
    digests = [registry.lowering_digest(op) for op in (func, schema_of(func).twin) if op is not None]
    own = tuple(digest or "" for digest in digests) if any(digests) else ()
    return own + (registry.corrections_digest(),)


def lowered_as_now(func: Any, signature: tuple) -> bool:
    """Whether a kernel signature kept from earlier (a saved plan's) names ``func``'s lowering as
    it is now: its trailing strings are the digests, after the tuple of scalar dtypes."""
    end = len(signature)
    while end and isinstance(signature[end - 1], str):
        end -= 1
    return signature[end:] == lowering_of(func)


def stored_kernel_plan(func: Any, leaves: Leaves) -> KernelPlan | None:
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
    return KernelPlan(func, leaves.device, kernel, signature, scalar_dtypes, layouts, kernel.metadata["structure"])


def kernel_plan(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, meta_out: Any) -> KernelPlan:
    device = leaves.device
    metas, kind = outputs(meta_out, func)
    for meta in metas:
        if meta is not None:
            check_kernel_dtype(meta.dtype, f"the result of {func}")
    for tensor in leaves.tensors:
        check_kernel_dtype(tensor.dtype, f"an input of {func}")
    orders = input_orders(func, leaves)
    out_orders = output_orders(func, leaves, metas)
    signature, scalar_dtypes = _kernel_signature(func, leaves, orders, out_orders)
    slots = _tensor_slots(leaves)
    dims = dynamic.dims_for(leaves, signature, slots)
    if dims is not None:
        plan = _dynamic_kernel_plan(func, schema, args, kwargs, leaves, metas, kind, signature, slots, dims, scalar_dtypes, orders, out_orders)
        if plan is not None:
            return plan
    read = orders or (None,) * len(leaves.tensors)
    inputs = [(permute_sizes(tuple(t.shape), o), t.dtype) for t, o in zip(leaves.tensors, read)] + [((), d) for d in scalar_dtypes]
    lowerings = lowerings_of(func, schema, args, kwargs, leaves, metas, inputs, orders, out_orders)
    written = written_sizes(metas, out_orders)
    metadata = {
        "outputs": [None if m is None else [list(w), str(m.dtype).replace("torch.", "")] for m, w in zip(metas, written)],
        "structure": kind,
    }
    if deferred.enabled() and not registry.compiles_in_foreground(func):
        lowering.prepare()
        kernel = kernel_cache.start(signature, device, lowerings, _describe(func, leaves), metadata)
    else:
        kernel = kernel_cache.kernel(signature, device, lowerings, _describe(func, leaves), metadata)
    return KernelPlan(func, device, kernel, signature, scalar_dtypes, _layouts(metas, out_orders), kind, orders, out_orders)


def _layouts(metas: list, out_orders: Orders | None) -> tuple:
    """(sizes, dtype) of each result as its kernel writes it, None kept as None."""
    return tuple(None if m is None else (sizes, m.dtype) for m, sizes in zip(metas, written_sizes(metas, out_orders)))


def _dynamic_kernel_plan(
    func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list, kind: str,
    signature: tuple, slots: list[int], dims: frozenset, scalar_dtypes: list, orders: Orders | None, out_orders: Orders | None,
) -> KernelPlan | None:
    """The plan of a kernel with ``dims`` dynamic (eager/dynamic.py), compiled now if new; None
    where it does not compile (the family then stays static) or this call's sizes do not fit
    the dims the family's ops need equal."""
    for _ in range(len(dims)):  # each round joins two symbols at least
        found = dynamic.dynamic_inputs(leaves, dims, signature, slots)
        if found is None:
            return None
        keyed, traced, symbol_dims = found
        keyed, traced = in_orders(keyed, traced, orders)
        dynamic_signature = list(signature)
        for slot, key in zip(slots, keyed):
            dynamic_signature[slot] = key
        dynamic_signature = tuple(dynamic_signature)
        kernel = kernel_cache.stored(dynamic_signature, leaves.device)
        inputs = traced + [((), d) for d in scalar_dtypes]
        at_one = any(leaves.tensors[i].shape[d] == 1 for i, d in dims)
        if kernel is None and at_one:
            return None  # a size of 1 is not known to run on a kernel traced at other sizes
        if kernel is None:
            lowerings = lowerings_of(func, schema, args, kwargs, leaves, metas, inputs, orders, out_orders)
            try:
                with accumulation.noting_symbolic_counts() as counted:
                    first, traced_first = _traced_first(lowerings)
            except SymbolsMustMatch as needed:
                groups = [symbol_dims[a] + symbol_dims[b] for a, b in needed.pairs]
                dynamic.must_match(signature, slots, leaves.device, groups)
                continue
            describe = f"{func}({', '.join(f'{k[2]}{list(k[1])}' for k in keyed)})"
            hints = {size.symbol: size.hint for sizes, _ in traced for size in sizes if isinstance(size, Dynamic)}
            # "sized": its program may not be the one a call's own sizes trace (a large reduction)
            metadata = {"outputs": None, "structure": kind, "dynamic": True, "traced_at": hints, "sized": bool(counted) or not traced_first}
            try:  # in the foreground: a family compiles one dynamic kernel, and a refusal must be known now
                kernel = kernel_cache.kernel(dynamic_signature, leaves.device, [first, *lowerings[1:]], describe, metadata)
            except CompileError:
                dynamic.refuse(signature, slots, leaves.device)
                return None
            dynamic.compiled(signature, slots, leaves.device)
        if (at_one or kernel.metadata.get("sized")) and not _serves(
            func, schema, args, kwargs, leaves, metas, inputs, kernel, (signature, dynamic_signature), orders, out_orders
        ):
            return None  # this call gets a kernel of its own
        return KernelPlan(func, leaves.device, kernel, dynamic_signature, scalar_dtypes, _layouts(metas, out_orders), kind, orders, out_orders)
    return None


def _serves(
    func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list, inputs: list, kernel: Kernel, signatures: tuple,
    orders: Orders | None, out_orders: Orders | None,
) -> bool:
    """Whether the family's dynamic kernel computes this call (with a size of 1 at one of its
    dynamic dims, or on a "sized" kernel) as a kernel for the call's own sizes would: its trace
    and a static one compared (kernels_cache/program_match.py), for the lowering and sizes the
    kernel was compiled from. ``signatures``: the call's and the kernel's.
    The answer is kept in the kernel cache for this call and this kernel (a family that later
    makes another dim dynamic asks again), so a new process does not trace again."""
    alternative, traced_at = kernel.metadata.get("alternative"), kernel.metadata.get("traced_at")
    key = ("a call on a dynamic kernel", *signatures, alternative, tuple(sorted((traced_at or {}).items())))
    kept = kernel_cache.choice(key, leaves.device)
    if kept is not None:
        return kept["served"]
    served = alternative in (AS_IT_IS, DECOMPOSED) and traced_at is not None and program_match.same_program(
        kernel_function(func, schema, args, kwargs, leaves, metas, orders, out_orders),
        inputs,
        traced_at,
        [sizes for sizes in written_sizes(metas, out_orders) if sizes is not None],
        lowering.trace_table(decompose=alternative == DECOMPOSED),
    )
    kernel_cache.keep_choice(key, leaves.device, {"op": _describe(func, leaves), "served": served})
    return served


def _traced_first(lowerings: list) -> tuple[Any, bool]:
    """The first lowering, traced now (raising SymbolsMustMatch before anything compiles), as a
    lowering that gives its text, or re-raises its error for the compile to report; and whether
    it traced."""
    try:
        text = lowerings[0]()
    except SymbolsMustMatch:
        raise
    except Exception as error:  # noqa: BLE001 - the compile tries the other lowerings and reports this
        failure = error

        def failed() -> str:
            raise failure

        return failed, False
    return (lambda: text), True


def _tensor_slots(leaves: Leaves) -> list[int]:
    """Where each tensor's key sits in the call's key (and so in its kernel signature)."""
    slots, tensors = [], leaves.tensors
    for position, part in enumerate(leaves.key):
        if len(slots) < len(tensors) and part is tensors[len(slots)]._key:
            slots.append(position)
    return slots
