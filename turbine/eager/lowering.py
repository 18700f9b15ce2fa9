"""Lowering a Python function over tensors (one aten op, usually) to torch-dialect MLIR, with the
op registry's decompositions when asked (the second try for an op that does not compile as it is),
or with its widening reductions read through gathers (decompositions/widening.py)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from turbine.eager import registry
from turbine.eager.decompositions import widening
from turbine.errors import CompileError
from turbine.kernels_cache import tracing
from turbine.kernels_cache.tracing import prepare


def lower(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]], decompose: bool = False) -> str:
    """MLIR text of ``fn`` traced on inputs of the given (sizes, dtype); with ``decompose``, the
    ops the registry has decompositions for (torch's and turbine's) are traced as those."""
    return tracing.lower(fn, inputs, registry.decompositions() if decompose else None)


def lower_through_gathers(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> str:
    """``lower`` with the registry's decompositions, and with reductions over an input's innermost
    dim reading the input, widened to their accumulator's dtype, through a gather (IREE 3.13's
    CUDA target compiles those); CompileError where the trace has no such reduction, so that the
    kernel is not compiled again as it was."""
    table, rewrote = widening.lowering_table()
    text = tracing.lower(fn, inputs, {**registry.decompositions(), **table})
    if not rewrote():
        raise CompileError("no reduction over an innermost dim to read through a gather")
    return text


__all__ = ["lower", "lower_through_gathers", "prepare"]
