"""Tracing an op call to a kernel: its signature in the kernel cache, and the function traced.

The traced function calls the op (or its registered correction) on the kernel's inputs: tensors,
then runtime scalars as 0-d tensors. Around the call it widens uint8 (IREE reads it as signed),
computes half precision in float32 as torch's "opmath" does, folds ``alpha`` in, and refuses
results whose shapes are not torch's shape rule's. A first try that does not compile is followed
by the op's decompositions (eager/registry.py), then, for 0-d inputs, the op on 1-d ones.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager import deferred, dynamic, lowering, registry
from turbine.eager.dtypes import check_kernel_dtype
from turbine.eager.kernel_plan import KernelPlan
from turbine.eager.meta import off_device
from turbine.eager.plans import layouts_of, outputs
from turbine.eager.scalars import number_dtype
from turbine.eager.schema import OpSchema, schema_of
from turbine.eager.signature import Leaves, is_runtime, rebuild
from turbine.errors import CompileError
from turbine.kernels_cache import kernel_cache, program_match
from turbine.kernels_cache.tracing import Dynamic, SymbolsMustMatch

aten = torch.ops.aten


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


def _in_opmath(func: Any, leaves: Leaves) -> bool:
    """Whether a kernel computes a float16 or bfloat16 op in float32 and rounds its results once.

    torch's CPU and CUDA kernels do (their "opmath"): a sum, a norm, a cumsum or a layer norm of
    bfloat16 values accumulates in float32, and ``x * 1.7`` multiplies by 1.7, not by 1.7 rounded
    to bfloat16 (1.703125). IREE's kernels traced as they are kept bfloat16 throughout: a sum of
    256 values came out up to 0.25 off. Runtime float scalars of such kernels cross as float32.
    """
    return not registry.has_trait(func, "native_precision") and any(t.dtype in _REDUCED for t in leaves.tensors)


def _kernel_signature(func: Any, leaves: Leaves) -> tuple[tuple, list]:
    """The kernel cache's signature of a call, and the dtypes its runtime scalars are passed as."""
    reference = _scalar_reference(leaves) if leaves.scalars else None
    if reference is not None and reference.dtype in _REDUCED and _in_opmath(func, leaves):
        reference = torch.empty((), dtype=torch.float32)
    scalar_dtypes = [
        check_kernel_dtype(_scalar_dtype(v, reference, number), f"a scalar argument of {func}")
        for v, number in zip(leaves.scalars, leaves.numbers)
    ]
    key = list(leaves.key)
    for slot, tensor in zip(_tensor_slots(leaves), leaves.tensors):
        key[slot] = tensor._key[:2]  # sizes and dtype: the kernel takes every input dense
    signature = _plain(tuple(key)) + (tuple(str(d) for d in scalar_dtypes),)
    schema = schema_of(func)
    if registry.correction(func) or (schema.twin is not None and registry.correction(schema.twin)):
        signature += ("corrected",)  # never a kernel cached from the uncorrected lowering
    return signature, scalar_dtypes


def _lowered_op(func: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    """The overload a kernel plan traces: the op, or its twin taking runtime scalars as tensors,
    unless this call compiles one of them in (pow's exponent 2: the op itself then)."""
    schema = schema_of(func)
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
    metas, kind = outputs(meta_out)
    for meta in metas:
        if meta is not None:
            check_kernel_dtype(meta.dtype, f"the result of {func}")
    for tensor in leaves.tensors:
        check_kernel_dtype(tensor.dtype, f"an input of {func}")
    signature, scalar_dtypes = _kernel_signature(func, leaves)
    slots = _tensor_slots(leaves)
    dims = dynamic.dims_for(leaves, signature, slots)
    if dims is not None:
        plan = _dynamic_kernel_plan(func, schema, args, kwargs, leaves, metas, kind, signature, slots, dims, scalar_dtypes)
        if plan is not None:
            return plan
    inputs = [(tuple(t.shape), t.dtype) for t in leaves.tensors] + [((), d) for d in scalar_dtypes]
    lowerings = _lowerings(func, schema, args, kwargs, leaves, metas, inputs)
    metadata = {
        "outputs": [None if m is None else [list(m.shape), str(m.dtype).replace("torch.", "")] for m in metas],
        "structure": kind,
    }
    if deferred.enabled() and not registry.compiles_in_foreground(func):
        lowering.prepare()
        kernel = kernel_cache.start(signature, device, lowerings, _describe(func, leaves), metadata)
    else:
        kernel = kernel_cache.kernel(signature, device, lowerings, _describe(func, leaves), metadata)
    return KernelPlan(func, device, kernel, signature, scalar_dtypes, layouts_of(metas), kind)


def _dynamic_kernel_plan(
    func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list, kind: str,
    signature: tuple, slots: list[int], dims: frozenset, scalar_dtypes: list,
) -> KernelPlan | None:
    """The plan of a kernel with ``dims`` dynamic (eager/dynamic.py), compiled now if new; None
    where it does not compile (the family then stays static) or this call's sizes do not fit
    the dims the family's ops need equal."""
    for _ in range(len(dims)):  # each round joins two symbols at least
        found = dynamic.dynamic_inputs(leaves, dims, signature, slots)
        if found is None:
            return None
        keyed, traced, symbol_dims = found
        dynamic_signature = list(signature)
        for slot, key in zip(slots, keyed):
            dynamic_signature[slot] = key
        dynamic_signature = tuple(dynamic_signature)
        kernel = kernel_cache.stored(dynamic_signature, leaves.device)
        if any(leaves.tensors[i].shape[d] == 1 for i, d in dims):
            inputs = traced + [((), d) for d in scalar_dtypes]
            if kernel is None or not _serves(func, schema, args, kwargs, leaves, metas, inputs, kernel, signature):
                return None  # the kernel is not known to be right at size 1: this call gets its own
        elif kernel is None:
            inputs = traced + [((), d) for d in scalar_dtypes]
            lowerings = _lowerings(func, schema, args, kwargs, leaves, metas, inputs)
            try:
                first = _traced_first(lowerings)
            except SymbolsMustMatch as needed:
                groups = [symbol_dims[a] + symbol_dims[b] for a, b in needed.pairs]
                dynamic.must_match(signature, slots, leaves.device, groups)
                continue
            describe = f"{func}({', '.join(f'{k[2]}{list(k[1])}' for k in keyed)})"
            hints = {size.symbol: size.hint for sizes, _ in traced for size in sizes if isinstance(size, Dynamic)}
            metadata = {"outputs": None, "structure": kind, "dynamic": True, "traced_at": hints}
            try:  # in the foreground: a family compiles one dynamic kernel, and a refusal must be known now
                kernel = kernel_cache.kernel(dynamic_signature, leaves.device, [first, *lowerings[1:]], describe, metadata)
            except CompileError:
                dynamic.refuse(signature, slots, leaves.device)
                return None
        return KernelPlan(func, leaves.device, kernel, dynamic_signature, scalar_dtypes, layouts_of(metas), kind)
    return None


def _serves(
    func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list, inputs: list, kernel: Any, signature: tuple
) -> bool:
    """Whether the family's dynamic kernel computes this call, which has a size of 1 at one of
    its dynamic dims, as a kernel for the call's own sizes would: its trace and a static one
    compared (kernels_cache/program_match.py), for the lowering and sizes the kernel was
    compiled from.
    The answer is kept in the kernel cache, so a new process does not trace again."""
    key = ("size 1 on a dynamic kernel", *signature)
    kept = kernel_cache.choice(key, leaves.device)
    if kept is not None:
        return kept["served"]
    alternative, traced_at = kernel.metadata.get("alternative"), kernel.metadata.get("traced_at")
    served = alternative in (0, 1) and traced_at is not None and program_match.same_program(
        _traced_call(func, schema, args, kwargs, leaves, metas),
        inputs,
        traced_at,
        [tuple(m.shape) for m in metas if m is not None],
        registry.decompositions() if alternative == 1 else None,
    )
    kernel_cache.keep_choice(key, leaves.device, {"op": _describe(func, leaves), "served": served})
    return served


def _traced_first(lowerings: list) -> Any:
    """The first lowering, traced now (raising SymbolsMustMatch before anything compiles), as a
    lowering that gives its text, or re-raises its error for the compile to report."""
    try:
        text = lowerings[0]()
    except SymbolsMustMatch:
        raise
    except Exception as error:  # noqa: BLE001 - the compile tries the other lowerings and reports this
        failure = error

        def failed() -> str:
            raise failure

        return failed
    return lambda: text


def _tensor_slots(leaves: Leaves) -> list[int]:
    """Where each tensor's key sits in the call's key (and so in its kernel signature)."""
    slots, tensors = [], leaves.tensors
    for position, part in enumerate(leaves.key):
        if len(slots) < len(tensors) and part is tensors[len(slots)]._key:
            slots.append(position)
    return slots


def _hinted(shape: Any) -> tuple:
    """A traced result's sizes, a dynamic size as the size it was traced at (no guard on it)."""
    return tuple(d.node.hint if isinstance(d, torch.SymInt) else d for d in shape)


def _lowerings(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list, inputs: list) -> list:
    """The ways to lower the call, in order: the op as it is; then torch's decompositions of it,
    where torch has some; then, for 0-d inputs, the op on 1-d ones."""
    traced = _traced_call(func, schema, args, kwargs, leaves, metas)
    count = len(leaves.tensors)
    result_shapes = [tuple(m.shape) for m in metas if m is not None]

    def checked(*values: torch.Tensor) -> list[torch.Tensor]:
        """traced, refusing results whose shapes are not the meta call's: torch's shape rule and
        its kernel disagree for some ops (native_batch_norm in eval mode: [C] against [0]), and
        then only the fallback gives torch's results."""
        outs = traced(*values)
        shapes = [_hinted(o.shape) for o in outs]
        if shapes != result_shapes:
            raise CompileError(f"the lowering gives results of shapes {shapes}, torch's shape rule {result_shapes}")
        return outs

    def traced_as_1d(*values: torch.Tensor) -> list[torch.Tensor]:
        """0-d tensor inputs as 1-element 1-d ones: IREE 3.13 cannot lower some reductions of 0-d
        tensors (amax, argmax, max.dim), and with dim 0 or -1 the op means the same on both."""
        values = [v.reshape(1) if i < count and v.dim() == 0 else v for i, v in enumerate(values)]
        return [o.reshape(shape) for o, shape in zip(traced(*values), result_shapes)]

    lowerings = [
        lambda: lowering.lower(checked, inputs),
        lambda: lowering.lower(checked, inputs, decompose=True) if func in registry.decompositions() else _no_lowering(),
    ]
    if any(t.dim() == 0 for t in leaves.tensors):
        lowerings.append(lambda: lowering.lower(traced_as_1d, inputs))
    return lowerings


def _traced_call(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list) -> Callable:
    """The function a kernel of the call traces: the op (or its correction) on the kernel's
    inputs, tensors then runtime scalars, its results in the meta call's dtypes."""
    target = _lowered_op(func, args, kwargs)
    target = registry.correction(target) or target
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
        call_kwargs = {name: off_device(value, "cpu") for name, value in call_kwargs.items()}
        if schema.symbolic:
            _as_numbers(schema, call_args, call_kwargs, _number_dtype(result_dtypes, values[:count]))
        if "alpha" in schema.runtime_scalars and "alpha" not in schema.symbolic:
            _fold_alpha(func, call_args, call_kwargs)
        out = target(*call_args, **call_kwargs)
        outs = [o for o in ([out] if isinstance(out, torch.Tensor) else out) if o is not None]
        return [o if o.dtype == d else o.to(d) for o, d in zip(outs, result_dtypes)]

    return traced


def _no_lowering() -> str:
    raise CompileError("torch has no decomposition for this op")
