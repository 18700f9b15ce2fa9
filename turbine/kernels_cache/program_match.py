"""Whether a dynamic kernel computes, at given sizes, what a kernel traced for those sizes would.

A dynamic kernel is traced with its dims as symbols that torch assumes to be 2 or more (sizes 0
and 1 are specialised, as in torch.compile), so its trace proves nothing about a size of 1: torch's
shape code asks "is this size 1?" everywhere (strides, contiguity, broadcasting), and a
decomposition may take another branch there. Rather than compile a kernel for each size-1 call,
the op is traced twice (no compile: tens of milliseconds) and the two programs compared: the
dynamic one (traced again as its kernel was) with its symbols replaced by this call's sizes, and
a static one at those sizes. When
they call the same aten ops in the same order, with the same arguments, sizes and dtypes, the
dynamic kernel (whose MLIR assumes nothing about its ``?`` dims) computes what the static one
would, and serves the call.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from turbine.kernels_cache import tracing
from turbine.kernels_cache.tracing import Dynamic

aten = torch.ops.aten


def same_program(
    fn: Callable,
    inputs: Sequence[tuple[tuple, torch.dtype]],
    traced_at: dict[str, int],
    result_shapes: list[tuple],
    decompositions: dict | None = None,
) -> bool:
    """Whether ``fn``'s kernel, traced with the ``Dynamic`` dims of ``inputs`` at the sizes
    ``traced_at`` gives each symbol (as its kernel was compiled), computes at the sizes in their
    hints what ``fn`` traced for those sizes computes, with results of ``result_shapes`` (torch's
    shape rule's). False where either trace fails or the programs differ (the caller then
    compiles a kernel for these sizes)."""
    exact = [(tuple(s.hint if isinstance(s, Dynamic) else s for s in sizes), dtype) for sizes, dtype in inputs]
    try:  # anything that fails (a trace, a size that divides by zero at 1) proves nothing
        generic = [(tuple(Dynamic(s.symbol, traced_at[s.symbol]) if isinstance(s, Dynamic) else s for s in sizes), dtype) for sizes, dtype in inputs]
        symbolic = tracing.trace(fn, generic, decompositions)
        static = tracing.trace(fn, exact, decompositions)
        results = next(node for node in static.graph.nodes if node.op == "output").args[0]
        if [tuple(node.meta["val"].shape) for node in results] != list(result_shapes):
            return False
        sizes = _sizes_of_symbols(symbolic, inputs)
        return sizes is not None and _program(symbolic, sizes) == _program(static, {})
    except Exception:  # noqa: BLE001 - the caller then compiles a kernel for these sizes
        return False


def _sizes_of_symbols(graph_module: torch.fx.GraphModule, inputs: Sequence[tuple[tuple, torch.dtype]]) -> dict | None:
    """Each symbol of the trace's inputs with the size this call has there; None if one symbol
    would need two sizes."""
    sizes: dict[sympy.Symbol, sympy.Integer] = {}
    placeholders = [node for node in graph_module.graph.nodes if node.op == "placeholder"]
    for node, (dims, _) in zip(placeholders, inputs):
        for traced, size in zip(node.meta["val"].shape, dims):
            if isinstance(traced, torch.SymInt):
                expr = traced.node.expr
                if not isinstance(expr, sympy.Symbol) or sizes.setdefault(expr, sympy.Integer(size.hint)) != size.hint:
                    return None
    return sizes


#: The ops of a symbolic trace that compute sizes rather than values (with Python's operators
#: and torch's ``sym_*`` functions on sizes): folded into the sizes they give.
_SIZE_OPS = frozenset(
    str(op) for op in (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default)
)


def _program(graph_module: torch.fx.GraphModule, sizes: dict) -> list:
    """The trace as plain values: each call (target, arguments, result sizes and dtypes) and
    constant tensor in order, symbolic sizes evaluated at ``sizes``; size arithmetic
    (``sym_size``, ``mul`` of sizes) folded into its value, so that a symbolic trace and a static
    one compare equal when they compute the same."""
    values: dict[torch.fx.Node, Any] = {}
    program: list = []
    for node in graph_module.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder":
            values[node] = ("input", len(values), _plain(value, sizes))
        elif node.op == "output":
            program.append(("output", _argument(node.args, values)))
        elif node.op == "get_attr":  # a constant tensor the trace captured: its contents count
            constant = getattr(graph_module, node.target)
            values[node] = ("result", len(program))
            program.append(("constant", constant.dtype, tuple(constant.shape), repr(constant.flatten().tolist())))  # NaN == NaN
        elif _size_arithmetic(node):
            values[node] = _number(value, sizes)
        else:
            values[node] = ("result", len(program))
            program.append((str(node.target), _argument(node.args, values), _argument(node.kwargs, values), _plain(value, sizes)))
    return program


def _size_arithmetic(node: torch.fx.Node) -> bool:
    """Whether a node computes a size (``sym_size``, Python's operators, ``torch.sym_max``)
    rather than a value of the program (``.item()`` of a tensor is one of the program's calls)."""
    if not isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
        return False
    target = node.target
    if str(target) in _SIZE_OPS:
        return True
    module = getattr(target, "__module__", None) or ""
    return module in ("_operator", "operator", "math") or getattr(target, "__name__", "").startswith("sym_")


def _argument(value: Any, values: dict) -> Any:
    if isinstance(value, torch.fx.Node):
        return values[value]
    if isinstance(value, (list, tuple)):
        return tuple(_argument(v, values) for v in value)
    if isinstance(value, dict):
        return tuple((k, _argument(v, values)) for k, v in value.items())
    return _typed(value)


def _typed(value: Any) -> Any:
    """A number with its type, so that 2, 2.0 and True differ as the ops taking them do; a float
    as its repr, so that a NaN equals itself (max.dim's correction fills with one)."""
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value) if isinstance(value, (bool, int)) else value


def _plain(value: Any, sizes: dict) -> Any:
    """A traced value's sizes and dtype (of each tensor, for several results), evaluated."""
    if isinstance(value, torch.Tensor):
        return (tuple(_number(s, sizes) for s in value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v, sizes) for v in value)
    return None if value is None else repr(value)


def _number(value: Any, sizes: dict) -> Any:
    """A size (or other number) of the trace at ``sizes``, with its type; a symbol left unknown (a
    value read from the data by ``.item()``) stays its name, which the same call of the other
    trace, compared before it, names alike."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = sympy.sympify(value.node.expr).xreplace(sizes)
        if expr in (sympy.true, sympy.false):
            return _typed(bool(expr))
        if expr.is_Integer:
            return _typed(int(expr))
        return _typed(float(expr)) if expr.is_Number else str(expr)
    return _typed(value)
