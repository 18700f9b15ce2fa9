"""The function a kernel of an op call traces, and the ways to lower it.

The traced function calls the op (or its registered correction) on the kernel's inputs: tensors,
then runtime scalars as 0-d tensors. Around the call it widens uint8 (IREE reads it as signed),
computes half precision in float32 as torch's "opmath" does, folds ``alpha`` in, and refuses
results whose shapes are not torch's shape rule's. A first try that does not compile is followed
by the op's decompositions (eager/registry.py), then the op with its reductions over an innermost
dim reading through gathers (eager/decompositions/widening.py), then, for 0-d inputs, the op on
1-d ones. Each of these traces the ops inside the op corrected too (eager/lowering.py); last come
the op as it is and decomposed without those inner corrections.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager import lowering, registry
from turbine.eager.kernel_orders import Orders, in_memory_order, written_sizes
from turbine.eager.meta import off_device
from turbine.eager.schema import OpSchema, schema_of
from turbine.eager.signature import Leaves, is_runtime, rebuild
from turbine.errors import CompileError

aten = torch.ops.aten


def _widen_unsigned(value: torch.Tensor) -> torch.Tensor:
    """Inside a trace: uint8 as int16 with its true values.

    IREE reads uint8 as signed (255 * 0.5 gave -0.5, 200 > 100 was false), so uint8 inputs are
    sign-extended and masked back to 0..255; results are cast back to torch's dtype, which
    wraps as uint8 arithmetic does.
    """
    if value.dtype == torch.uint8:
        return value.to(torch.int16).bitwise_and(255)
    return value


def _wraps_to_unsigned(func: Any, args: tuple, kwargs: dict, result_dtypes: list) -> bool:
    """Whether the call computes in uint8 as an elementwise op: torch then casts its other integer
    operands (0-d tensors and numbers, which do not promote) to uint8 first, so -3 is 253 to
    ``maximum``, ``<`` or ``floor_divide``; the trace widens uint8 and would read -3 as -3. Not
    for ops whose results are floats (true division computes in float32)."""
    if any(d not in (torch.uint8, torch.bool) for d in result_dtypes):
        return False
    name = func.overloadpacket.__name__.rstrip("_")
    functional = getattr(getattr(aten, name, None), func._overloadname, func)
    if torch.Tag.pointwise not in (*func.tags, *functional.tags) and name != "floor_divide":
        return False
    operands = [v for v in (*args, *kwargs.values()) if isinstance(v, (torch.Tensor, bool, int, float, complex))]
    kind = torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    return torch._prims_common.elementwise_dtypes(*operands, type_promotion_kind=kind)[0] == torch.uint8


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
    return torch.float32 if dtype in REDUCED else dtype


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


REDUCED = (torch.bfloat16, torch.float16)


def in_opmath(func: Any, leaves: Leaves) -> bool:
    """Whether a kernel computes a float16 or bfloat16 op in float32 and rounds its results once.

    torch's CPU and CUDA kernels do (their "opmath"): a sum, a norm, a cumsum or a layer norm of
    bfloat16 values accumulates in float32, and ``x * 1.7`` multiplies by 1.7, not by 1.7 rounded
    to bfloat16 (1.703125). IREE's kernels traced as they are kept bfloat16 throughout: a sum of
    256 values came out up to 0.25 off. Runtime float scalars of such kernels cross as float32.
    """
    return not registry.has_trait(func, "native_precision") and any(t.dtype in REDUCED for t in leaves.tensors)


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


def _hinted(shape: Any) -> tuple:
    """A traced result's sizes, a dynamic size as the size it was traced at (no guard on it)."""
    return tuple(d.node.hint if isinstance(d, torch.SymInt) else d for d in shape)


#: The device kinds whose kernels get the lowering through gathers (eager/decompositions/widening.py):
#: IREE's GPU targets. llvm-cpu compiles every such reduction as traced, and there the alternative
#: only added a compile to each op that failed for another reason (CI took a third longer).
GATHERED_ON = ("cuda", "hip")

#: Positions in ``lowerings_of``'s list (a kernel's metadata names the one it compiled from):
#: the traced call as it is, and with the registry's decompositions.
AS_IT_IS, DECOMPOSED = 0, 1


def lowerings_of(
    func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list, inputs: list,
    orders: Orders | None = None, out_orders: Orders | None = None,
) -> list:
    """The ways to lower the call, in order: the op as it is (``AS_IT_IS``); then torch's
    decompositions of it, where torch has some (``DECOMPOSED``); then, on a GPU (``GATHERED_ON``),
    the op with its reductions over an innermost dim read through gathers; then, for 0-d
    inputs, the op on 1-d ones, as it is and decomposed; then, for an op whose correction is a "refinement", the op
    without it, as it is and decomposed; last, as it is and decomposed without the corrections
    of the ops inside it. Each reads its inputs and writes its results in ``orders`` and
    ``out_orders`` where given (eager/kernel_orders.py)."""
    count = len(leaves.tensors)

    def kernel_of(corrected: bool) -> Callable:
        return kernel_function(func, schema, args, kwargs, leaves, metas, orders, out_orders, corrected)

    traced = kernel_of(corrected=True)
    result_shapes = [sizes for sizes in written_sizes(metas, out_orders) if sizes is not None]

    def shape_checked(traced: Callable) -> Callable:
        """``traced``, refusing results whose shapes are not the meta call's: torch's shape rule
        and its kernel disagree for some ops (native_batch_norm in eval mode: [C] against [0]),
        and then only the fallback gives torch's results."""

        def checked(*values: torch.Tensor) -> list[torch.Tensor]:
            outs = traced(*values)
            shapes = [_hinted(o.shape) for o in outs]
            if shapes != result_shapes:
                raise CompileError(f"the lowering gives results of shapes {shapes}, torch's shape rule {result_shapes}")
            return outs

        return checked

    checked = shape_checked(traced)

    def traced_as_1d(*values: torch.Tensor) -> list[torch.Tensor]:
        """0-d tensor inputs as 1-element 1-d ones: IREE 3.13 cannot lower some reductions of 0-d
        tensors (amax, argmax, max.dim), its compiler crashed on frexp's decomposition of a 0-d
        tensor, and with dim 0 or -1 the op means the same on both."""
        values = [v.reshape(1) if i < count and v.dim() == 0 else v for i, v in enumerate(values)]
        return [o.reshape(shape) for o, shape in zip(traced(*values), result_shapes)]

    decomposed = func in registry.decompositions()

    def as_is_and_decomposed(fn: Callable, corrected: bool = True) -> list[Callable[[], str]]:
        return [
            lambda: lowering.lower(fn, inputs, corrected=corrected),
            lambda: lowering.lower(fn, inputs, decompose=True, corrected=corrected) if decomposed else _no_lowering(),
        ]

    lowerings = as_is_and_decomposed(checked)
    if leaves.device is not None and leaves.device.kind in GATHERED_ON:
        lowerings.append(lambda: lowering.lower_through_gathers(checked, inputs))
    if any(t.dim() == 0 for t in leaves.tensors):
        lowerings += as_is_and_decomposed(traced_as_1d)
    ways = [checked]
    if registry.has_trait(_lowered_op(func, args, kwargs), "refinement"):
        ways.append(shape_checked(kernel_of(corrected=False)))
        lowerings += as_is_and_decomposed(ways[-1])
    # Last, each without the corrections of the ops inside it, for a target that compiles the op
    # but not one of those (kernels_cache skips a text that is the same as one tried before)
    for way in ways:
        lowerings += as_is_and_decomposed(way, corrected=False)
    return lowerings


def kernel_function(
    func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list,
    orders: Orders | None = None, out_orders: Orders | None = None, corrected: bool = True,
) -> Callable:
    """The traced call (:func:`traced_call`) reading its inputs and writing its results in
    ``orders`` and ``out_orders`` where given (eager/kernel_orders.py)."""
    traced = traced_call(func, schema, args, kwargs, leaves, metas, corrected=corrected)
    if orders is None and out_orders is None:
        return traced
    written = None if out_orders is None else [o for m, o in zip(metas, out_orders) if m is not None]
    return in_memory_order(traced, len(leaves.tensors), orders, written)


def traced_call(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, metas: list, corrected: bool = True) -> Callable:
    """The function a kernel of the call traces: the op (or, if ``corrected``, its correction) on
    the kernel's inputs, tensors then runtime scalars, its results in the meta call's dtypes."""
    op = _lowered_op(func, args, kwargs)
    target = (registry.correction(op) or op) if corrected else op
    count = len(leaves.tensors)
    result_dtypes = [m.dtype for m in metas if m is not None]
    opmath = in_opmath(func, leaves)
    wraps = _wraps_to_unsigned(func, args, kwargs, result_dtypes)

    def traced(*values: torch.Tensor) -> list[torch.Tensor]:
        if wraps:  # the other operands are 0-d integers or booleans
            values = [v if v.dtype == torch.bool else v.to(torch.uint8) for v in values]
        values = [_widen_unsigned(v) for v in values]
        if opmath:
            values = [v.to(torch.float32) if v.dtype in REDUCED else v for v in values]
        tensors = iter(values[:count])
        scalars = iter(values[count:])
        call_args, call_kwargs = rebuild(schema, args, kwargs, lambda _: next(tensors), lambda _: next(scalars))
        call_kwargs = {name: off_device(value, "cpu") for name, value in call_kwargs.items()}
        if schema.symbolic:
            _as_numbers(schema, call_args, call_kwargs, _number_dtype(result_dtypes, values[:count]))
        if "alpha" in schema.runtime_scalars and "alpha" not in schema.symbolic:
            _fold_alpha(func, call_args, call_kwargs)
        with lowering.correcting(op):  # the op it calls is itself, not its correction again
            out = target(*call_args, **call_kwargs)
        outs = [o for o in ([out] if isinstance(out, torch.Tensor) else out) if o is not None]
        return [_rounded(o, d) for o, d in zip(outs, result_dtypes)]

    return traced


def _rounded(result: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A traced result in the op's dtype; float64 reaches float16 and bfloat16 through float32,
    as in torch (IREE 3.13's direct conversion flushed float16's subnormals to 0)."""
    if result.dtype == dtype:
        return result
    if result.dtype == torch.float64 and dtype in REDUCED:
        result = result.to(torch.float32)
    return result.to(dtype)


def _no_lowering() -> str:
    raise CompileError("torch has no decomposition for this op")
