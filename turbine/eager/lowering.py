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


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """torch's core-aten decompositions: the second try for an op IREE cannot compile as it is."""
    return dict(torch._decomp.core_aten_decompositions())


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
