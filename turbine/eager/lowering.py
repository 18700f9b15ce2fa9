"""Lowering a Python function over tensors (one aten op, usually) to torch-dialect MLIR, with the
op registry's decompositions when asked (the second try for an op that does not compile as it is)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from turbine.eager import registry
from turbine.kernels_cache import tracing
from turbine.kernels_cache.tracing import prepare


def lower(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]], decompose: bool = False) -> str:
    """MLIR text of ``fn`` traced on inputs of the given (sizes, dtype); with ``decompose``, the
    ops the registry has decompositions for (torch's and turbine's) are traced as those."""
    return tracing.lower(fn, inputs, registry.decompositions() if decompose else None)


__all__ = ["lower", "prepare"]
