"""Lowering a Python function over tensors (one aten op, usually) to torch-dialect MLIR.

The function is traced with ``make_fx`` on fake tensors (no data, no torch.export: FACTS.md
measured 1.6-3.6 s for export against under 40 ms for this) and imported by IREE's FxImporter.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from iree.compiler.extras.fx_importer import FxImporter


def _squeeze_dims(tensor: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``squeeze.dims`` as a reshape: IREE 3.13 does not know the op, which decompositions emit."""
    dims = {d % max(tensor.dim(), 1) for d in dims}
    shape = [size for d, size in enumerate(tensor.shape) if not (d in dims and size == 1)]
    return torch.ops.aten.reshape.default(tensor, shape)


def _pow_tensor_tensor(base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``pow`` with a tensor exponent, right for negative bases.

    IREE computes it as exp(log(base) * exponent): a negative base gave NaN even for an integral
    exponent, where torch gives (-2) ** 2 == 4. The magnitude comes from |base| and the sign
    from the exponent's parity; non-integral powers of negative numbers stay NaN as in torch.
    """
    aten = torch.ops.aten
    result = aten.pow.Tensor_Tensor(base, exponent)
    if not result.dtype.is_floating_point:
        return result
    base, exponent = base.to(result.dtype), exponent.to(result.dtype)
    magnitude = aten.pow.Tensor_Tensor(base.abs(), exponent)
    integral = exponent == exponent.floor()
    odd = aten.remainder.Scalar(exponent, 2) == 1
    negative = torch.where(integral, torch.where(odd, -magnitude, magnitude), torch.full_like(magnitude, float("nan")))
    return torch.where(base < 0, negative, magnitude)


def _select_scatter(input: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    """``select_scatter`` with a non-negative index: IREE 3.13 wrote a negative one to the wrong place."""
    size = input.shape[dim]
    return torch.ops.aten.select_scatter.default(input, src, dim, index + size if index < 0 else index)


def _wrapped_indices(input: torch.Tensor, indices: Sequence) -> list:
    """Index tensors with negative entries counted from the end, as torch reads them.

    IREE's gather and scatter take indices as they are, so a negative one read (or wrote!) outside
    the tensor: index_put with negative indices crashed the process.
    """
    wrapped = []
    for dim, index in enumerate(indices):
        if index is not None and not index.dtype.is_floating_point and index.dtype != torch.bool:
            index = torch.where(index < 0, index + input.shape[dim], index)
        wrapped.append(index)
    return wrapped


def _index(input: torch.Tensor, indices: Sequence) -> torch.Tensor:
    return torch.ops.aten.index.Tensor(input, _wrapped_indices(input, indices))


def _index_put(input: torch.Tensor, indices: Sequence, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    return torch.ops.aten.index_put.default(input, _wrapped_indices(input, indices), values, accumulate)


def _decomposed(op: torch._ops.OpOverload) -> Callable:
    return torch._decomp.decomposition_table[op]


_aten = torch.ops.aten

#: Ops whose IREE 3.13 lowering gives wrong values, traced as these equivalents instead. Those
#: found by the OpInfo run (tests/opinfo): ``leaky_relu_backward`` and ``softshrink`` as one op
#: took the wrong branch for many elements; torch's decompositions of them are right.
CORRECTIONS = {
    _aten.pow.Tensor_Tensor: _pow_tensor_tensor,
    _aten.leaky_relu_backward.default: _decomposed(_aten.leaky_relu_backward.default),
    _aten.softshrink.default: _decomposed(_aten.softshrink.default),
    _aten.select_scatter.default: _select_scatter,
    _aten.index.Tensor: _index,
    _aten.index_put.default: _index_put,
    _aten.renorm.default: _decomposed(_aten.renorm.default),  # a negative dim renormed the wrong slices
}

#: Ops IREE 3.13 compiles but computes wrongly, with no correct equivalent to trace: they go to
#: the fallback policy.
MISCOMPILED = {
    _aten.logcumsumexp.default: "IREE 3.13's kernel gives inf for ordinary inputs",
}


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """torch's core-aten decompositions: the second try for an op IREE cannot compile as it is."""
    table = dict(torch._decomp.core_aten_decompositions())
    table[torch.ops.aten.squeeze.dims] = _squeeze_dims
    return table


def lower(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]], decompose: bool = False) -> str:
    """MLIR text of ``fn`` traced on inputs of the given (sizes, dtype); exported as ``main``."""
    # torch.empty reserves address space but touches no memory, so large shapes cost nothing here.
    examples = [torch.empty(sizes, dtype=dtype) for sizes, dtype in inputs]
    table = decompositions() if decompose else None
    # torch's C++ code can reach turbine with Python dispatch turned off (tensor creation from
    # data does); tracing needs it back on, so the trace runs with it re-enabled.
    excluded = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.Python)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
        graph_module = make_fx(fn, tracing_mode="fake", decomposition_table=table)(*examples)
    importer = FxImporter()
    importer.import_stateless_graph(graph_module.graph, func_name="main")
    return str(importer.module)
