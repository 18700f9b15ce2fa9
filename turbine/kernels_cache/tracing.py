"""Lowering a Python function over tensors (one aten op, usually) to torch-dialect MLIR.

The function is traced with ``make_fx`` on fake tensors (no data, no torch.export: FACTS.md
measured 1.6-3.6 s for export against under 40 ms for this) and imported by IREE's FxImporter.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from iree.compiler.extras.fx_importer import FxImporter


_tracing = threading.RLock()


def lower(fn: Callable, inputs: Sequence[tuple[tuple[int, ...], torch.dtype]], decompositions: dict | None = None) -> str:
    """MLIR text of ``fn`` traced on inputs of the given (sizes, dtype); exported as ``main``.

    ``decompositions`` (op -> function) replaces the ops it names while tracing."""
    # torch.empty reserves address space but touches no memory, so large shapes cost nothing here.
    examples = [torch.empty(sizes, dtype=dtype) for sizes, dtype in inputs]
    # Traces see ops as turbine's dispatch does, below autograd: there a composite op (isclose)
    # arrives whole and the decomposition table decides; above it, a compile thread saw torch's
    # own decomposition (an in-place bitwise_and_ IREE cannot lower). torch's C++ code can also
    # reach turbine with Python dispatch turned off (tensor creation from data does); tracing
    # needs it back on. make_fx keeps its current tracer in a module global
    # (_CURRENT_MAKE_FX_TRACER in torch 2.13), so traces from compile threads take turns.
    with _tracing, torch._C._AutoDispatchBelowADInplaceOrView():
        excluded = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.Python)
        with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
            graph_module = make_fx(fn, tracing_mode="fake", decomposition_table=decompositions)(*examples)
    importer = FxImporter()
    importer.import_stateless_graph(graph_module.graph, func_name="main")
    return str(importer.module)


@functools.lru_cache(maxsize=None)
def prepare() -> None:
    """Trace one op on the calling thread, once per process, before any trace on a compile thread.

    The first trace imports some 350 of torch's modules (torch._dynamo among them), and Python's
    imports of modules that import each other are not safe to race: a meta call on the main
    thread then met a partially initialised torch._inductor.utils. Later traces import nothing.
    """
    lower(lambda a: [a + a], [((1,), torch.float32)])
