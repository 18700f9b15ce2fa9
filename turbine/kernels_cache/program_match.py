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
    try:
        generic = [(tuple(Dynamic(s.symbol, traced_at[s.symbol]) if isinstance(s, Dynamic) else s for s in sizes), dtype) for sizes, dtype in inputs]
        symbolic = tracing.trace(fn, generic, decompositions)
        static = tracing.trace(fn, exact, decompositions)
    except Exception:  # noqa: BLE001 - a trace that fails proves nothing; the caller compiles instead
        return False
    results = next(node for node in static.graph.nodes if node.op == "output").args[0]
    if [tuple(node.meta["val"].shape) for node in results] != list(result_shapes):
        return False
    sizes = _sizes_of_symbols(symbolic, inputs)
    return sizes is not None and _program(symbolic, sizes) == _program(static, {})


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


def _program(graph_module: torch.fx.GraphModule, sizes: dict) -> list:
    """The trace as plain values: each call (target, arguments, result sizes and dtypes) in order,
    symbolic sizes evaluated at ``sizes``; size arithmetic (``sym_size``, ``mul``) folded away, so
    that a symbolic trace and a static one compare equal when they compute the same."""
    values: dict[torch.fx.Node, Any] = {}
    program: list = []
    for node in graph_module.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder":
            values[node] = ("input", len(values), _plain(value, sizes))
        elif node.op == "output":
            program.append(("output", _argument(node.args, values)))
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
            values[node] = _number(value, sizes)  # size arithmetic: its value is what the program uses
        else:
            values[node] = ("result", len(program))
            program.append((str(node.target), _argument(node.args, values), _argument(node.kwargs, values), _plain(value, sizes)))
    return program


def _argument(value: Any, values: dict) -> Any:
    if isinstance(value, torch.fx.Node):
        return values[value]
    if isinstance(value, (list, tuple)):
        return tuple(_argument(v, values) for v in value)
    if isinstance(value, dict):
        return tuple((k, _argument(v, values)) for k, v in value.items())
    return value


def _plain(value: Any, sizes: dict) -> Any:
    """A traced value's sizes and dtype (of each tensor, for several results), evaluated."""
    if isinstance(value, torch.Tensor):
        return (tuple(_number(s, sizes) for s in value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v, sizes) for v in value)
    return None if value is None else repr(value)


def _number(value: Any, sizes: dict) -> Any:
    """A size (or other number) of the trace at ``sizes``; a symbol left unknown (a size from the
    data) stays a string, which matches nothing in a static trace."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = sympy.sympify(value.node.expr).xreplace(sizes)
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        return int(expr) if expr.is_Integer else float(expr) if expr.is_Number else str(expr)
    return value
