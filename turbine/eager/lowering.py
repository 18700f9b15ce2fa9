"""Lowering a Python function over tensors (one aten op, usually) to torch-dialect MLIR.

Every trace takes the op registry's corrections: an op with a wrong IREE lowering is traced as
its correction wherever it appears, inside another op's decomposition or another correction too
(xlog1py's decomposition took IREE's float64 log1p, 1.4e-9 relative off). Asked to, a trace also
takes the registry's decompositions (the second try for an op that does not compile as it is),
or reads its widening reductions through gathers (decompositions/widening.py).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Sequence

import torch

from turbine.eager import registry
from turbine.eager.decompositions import widening
from turbine.errors import CompileError
from turbine.kernels_cache import tracing
from turbine.kernels_cache.tracing import prepare

OpOverload = torch._ops.OpOverload

_correcting = threading.local()


def _being_corrected() -> set:
    if not hasattr(_correcting, "ops"):
        _correcting.ops = set()
    return _correcting.ops


@contextlib.contextmanager
def correcting(op: OpOverload) -> Iterator[None]:
    """While ``op``'s correction (or the op in its stead) is traced: its own calls of ``op`` are
    traced as the op, not corrected again (a correction calls the op it corrects)."""
    ops = _being_corrected()
    added = op not in ops
    ops.add(op)
    try:
        yield
    finally:
        if added:
            ops.discard(op)


def _corrected(op: OpOverload, correction: Callable, inner: Callable | None) -> Callable:
    """What a trace takes for ``op``: its correction, or inside that correction ``inner`` (the
    op's entry in the table below, its decomposition say), else the op as it is."""

    def traced(*args, **kwargs):
        if op in _being_corrected():
            return inner(*args, **kwargs) if inner is not None else NotImplemented  # NotImplemented: the op itself
        with correcting(op):
            return correction(*args, **kwargs)

    return traced


def trace_table(decompose: bool = False, corrected: bool = True) -> dict | None:
    """The table a trace replaces ops by: with ``decompose`` the registry's decompositions (torch's
    and turbine's); with ``corrected`` every registered correction, over them."""
    table = registry.decompositions() if decompose else {}
    return _with_corrections(table) if corrected else table or None


def _with_corrections(table: dict) -> dict:
    corrections = {op: e.correction for op, e in registry.entries().items() if e.correction is not None}
    return {**table, **{op: _corrected(op, c, table.get(op)) for op, c in corrections.items()}}


def lower(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]], decompose: bool = False, corrected: bool = True) -> str:
    """MLIR text of ``fn`` traced on inputs of the given (sizes, dtype), its ops corrected (unless
    not ``corrected``: a kernel whose inner corrections do not compile for its target may compile
    without them) and, with ``decompose``, decomposed."""
    return tracing.lower(fn, inputs, trace_table(decompose, corrected))


def lower_through_gathers(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> str:
    """``lower`` with the registry's decompositions, and with reductions over an input's innermost
    dim reading the input, widened to their accumulator's dtype, through a gather (IREE 3.13's
    CUDA target compiles those); CompileError where the trace has no such reduction, so that the
    kernel is not compiled again as it was."""
    table, rewrote = widening.lowering_table()
    text = tracing.lower(fn, inputs, _with_corrections({**registry.decompositions(), **table}))
    if not rewrote():
        raise CompileError("no reduction over an innermost dim to read through a gather")
    return text


__all__ = ["correcting", "lower", "lower_through_gathers", "prepare", "trace_table"]
