"""Lowering a Python function over tensors (one aten op, usually) to torch-dialect MLIR.

The function is traced with ``make_fx`` on fake tensors (no data, no torch.export: FACTS.md
measured 1.6-3.6 s for export against under 40 ms for this) and imported by IREE's FxImporter.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Sequence

import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from iree.compiler.extras.fx_importer import FxImporter

from turbine.errors import CompileError


_tracing = threading.RLock()
_in_trace = threading.local()


class _QuietInTraces(logging.Filter):
    """Drops torch's fake-tensor ERROR log records made while this thread traces for turbine.

    A trace whose op's shape rule refuses it (``_grouped_mm`` traced in float32 "opmath" wants
    bfloat16) is a lowering that failed: turbine takes the error, and the op goes to the fallback
    policy with its reason. torch also logged it at ERROR with a traceback ("failed while
    attempting to run meta for ..."), which read as a crash in a notebook."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not getattr(_in_trace, "active", False)


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietInTraces())


def lower(fn: Callable, inputs: Sequence[tuple[tuple, torch.dtype]], decompositions: dict | None = None) -> str:
    """MLIR text of ``fn`` traced on inputs of the given (sizes, dtype); exported as ``main``.

    A size may be a ``Dynamic`` dim instead of a number: the kernel then takes any size there
    (dims of one ``Dynamic.symbol`` take equal sizes). A trace whose ops need two symbols equal
    (bmm's inner dims) raises SymbolsMustMatch, so the caller can give them one symbol; one whose
    ops would branch on a size otherwise is refused with CompileError, since the kernel must
    serve every size.
    ``decompositions`` (op -> function) replaces the ops it names while tracing."""
    graph_module = trace(fn, inputs, decompositions)
    _refuse_complex(graph_module)
    importer = FxImporter()
    importer.import_stateless_graph(graph_module.graph, func_name="main")
    return str(importer.module)


def trace(fn: Callable, inputs: Sequence[tuple[tuple, torch.dtype]], decompositions: dict | None = None) -> torch.fx.GraphModule:
    """``fn``'s aten program on inputs of the given (sizes, dtype), as ``lower`` compiles it."""
    dynamic = any(isinstance(size, Dynamic) for sizes, _ in inputs for size in sizes)
    # Traces see ops as turbine's dispatch does, below autograd: there a composite op (isclose)
    # arrives whole and the decomposition table decides; above it, a compile thread saw torch's
    # own decomposition (an in-place bitwise_and_ IREE cannot lower). torch's C++ code can also
    # reach turbine with Python dispatch turned off (tensor creation from data does); tracing
    # needs it back on, with the snapshot of Python's dispatch state that goes before it (without
    # it, torch.tensor([0-d turbine tensors]) on CUDA failed an internal assert of torch's). make_fx keeps its current tracer in a module global
    # (_CURRENT_MAKE_FX_TRACER in torch 2.13), so traces take turns.
    with _tracing, torch._C._AutoDispatchBelowADInplaceOrView():
        keys = torch._C.DispatchKey
        excluded = torch._C._dispatch_tls_local_exclude_set().remove(keys.Python).remove(keys.PythonTLSSnapshot)
        with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
            outer, _in_trace.active = getattr(_in_trace, "active", False), True
            try:
                if dynamic:
                    return _trace_dynamic(fn, inputs, decompositions)
                # torch.empty reserves address space but touches no memory, so large shapes cost nothing.
                examples = [torch.empty(sizes, dtype=dtype) for sizes, dtype in inputs]
                return make_fx(fn, tracing_mode="fake", decomposition_table=decompositions)(*examples)
            finally:
                _in_trace.active = outer


def _refuse_complex(graph_module: torch.fx.GraphModule) -> None:
    """IREE 3.13's compiler crashes (SIGSEGV, in torch-mlir's fill of a ``complex<f32>`` tensor)
    on kernels with complex values, costing a compiler process each: such traces are refused."""
    for node in graph_module.graph.nodes:
        values = node.meta.get("val")
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if isinstance(value, torch.Tensor) and value.dtype.is_complex:
                raise CompileError(f"IREE 3.13 does not compile kernels with complex values ({node.target} gives {value.dtype})")


class SymbolsMustMatch(CompileError):
    """The traced ops need dynamic dims of different symbols to be equal: ``pairs`` of symbols."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(f"the lowering needs equal sizes at {', '.join(f'{a} = {b}' for a, b in pairs)}")
        self.pairs = pairs


class Dynamic:
    """A dim a kernel takes at any size of 2 or more (at 1 where program_match.py shows it);
    ``hint`` is the size it is traced at. Dims with the same ``symbol`` take the same size
    (torch's shape rules may need them equal)."""

    __slots__ = ("symbol", "hint")

    def __init__(self, symbol: str, hint: int) -> None:
        self.symbol = symbol
        self.hint = hint

    def __repr__(self) -> str:
        return self.symbol


def _trace_dynamic(fn: Callable, inputs: Sequence[tuple[tuple, torch.dtype]], decompositions: dict | None) -> torch.fx.GraphModule:
    """``fn`` traced on fake tensors whose ``Dynamic`` dims are symbols of one shape environment."""
    shape_env = ShapeEnv(duck_shape=False)  # equal sizes are not the same symbol by chance
    mode = FakeTensorMode(shape_env=shape_env)
    symbols: dict[str, list] = {}
    examples = []
    for position, (sizes, dtype) in enumerate(inputs):
        example = mode.from_tensor(
            torch.empty([s.hint if isinstance(s, Dynamic) else s for s in sizes], dtype=dtype),
            source=ConstantSource(f"input{position}"),  # a symbol of its own for each dim
            symbolic_context=StatelessSymbolicContext(
                dynamic_sizes=[DimDynamic.DYNAMIC if isinstance(s, Dynamic) else DimDynamic.STATIC for s in sizes]
            ),
        )
        examples.append(example)
        for size, traced in zip(sizes, example.shape):
            if isinstance(size, Dynamic):
                symbols.setdefault(size.symbol, []).append(traced)
    # Dims of one symbol are made equal before the trace, so that no op's check guards on it.
    for same in symbols.values():
        for other in same[1:]:
            torch._check(other == same[0])
    names = {same[0].node.expr: name for name, same in symbols.items()}  # before a guard replaces one
    before = len(shape_env.guards)
    graph_module = make_fx(fn, tracing_mode="symbolic", decomposition_table=decompositions)(*examples)
    guards = [guard.expr for guard in shape_env.guards[before:]]
    if guards:
        pairs = [_equality(guard, names) for guard in guards]
        if all(pairs):
            raise SymbolsMustMatch(sorted(set(pairs)))
        raise CompileError(f"the lowering depends on the sizes of its dynamic dims ({', '.join(map(str, guards[:3]))})")
    return graph_module


def _equality(guard: Any, names: dict) -> tuple[str, str] | None:
    """The two symbols' names if ``guard`` says that two input symbols are equal, else None."""
    free = sorted(guard.free_symbols, key=str)
    if not isinstance(guard, sympy.Eq) or len(free) != 2 or not all(f in names for f in free):
        return None
    if guard.subs(free[1], free[0]) is not sympy.true:
        return None
    return tuple(sorted((names[free[0]], names[free[1]])))


@functools.lru_cache(maxsize=None)
def prepare() -> None:
    """Trace one op on the calling thread, once per process, before any trace on a compile thread.

    The first trace imports some 350 of torch's modules (torch._dynamo among them), and Python's
    imports of modules that import each other are not safe to race: a meta call on the main
    thread then met a partially initialised torch._inductor.utils. Later traces import nothing.
    """
    lower(lambda a: [a + a], [((1,), torch.float32)])
