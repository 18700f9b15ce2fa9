"""Helpers shared by turbine's decompositions: declaring them in the op registry, shape rules for
ops torch has none for, and dtype rules."""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager.registry import declare

def reduced_dims(input: torch.Tensor, dim: Any) -> list[int]:
    """The dims (from 0) a reduction of ``input`` over ``dim`` reduces: a dim, a list, or None
    and [] for all; none of a 0-d tensor (its dim 0 or -1 is the tensor itself)."""
    if input.dim() == 0:
        return []
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(input.dim()))
    return [d % input.dim() for d in ([dim] if isinstance(dim, int) else dim)]


def registers(*ops: torch._ops.OpOverload) -> Callable[[Callable], Callable]:
    """Decorator: declare ``fn`` (its docstring's first line says why) the decomposition of each
    of ``ops`` in the op registry, traced when IREE cannot compile them as they are."""

    def register(fn: Callable) -> Callable:
        source = getattr(fn, "__wrapped__", fn)
        source = getattr(source, "func", source)  # a functools.partial: its function
        why = (source.__doc__ or "").strip().splitlines()[:1]
        declare(list(ops), f"turbine's own, written with ops IREE compiles{': ' + why[0] if why else ''}", decomposition=fn)
        return fn

    return register


#: Shape rules (Meta kernels) for aten ops torch has none for, by op name (``shape_rule``).
_SHAPE_RULES: dict[str, Callable] = {}
_library: torch.library.Library | None = None


def shape_rule(op: str) -> Callable[[Callable], Callable]:
    """Decorator: ``fn`` is the shape rule of ``aten::op``, which torch has none for; turbine
    plans an op from its meta call. Registered by ``register_shape_rules``."""

    def record(fn: Callable) -> Callable:
        _SHAPE_RULES[op] = fn
        return fn

    return record


def register_shape_rules() -> None:
    """Register every recorded shape rule as the op's Meta kernel (the backend calls this; a
    later torch's own kernel wins, and a second call does nothing). torch's fake tensors use
    them too."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
    for op, rule in _SHAPE_RULES.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "Meta"):
            _library.impl(op, rule, "Meta")


def floating(x: torch.Tensor) -> torch.Tensor:
    """``x`` as torch's unary float ops see it: integers and bools become the default float."""
    return x if x.dtype.is_floating_point else x.to(torch.get_default_dtype())


def as_float64(x: torch.Tensor) -> torch.Tensor:
    """float64, where the special functions are evaluated."""
    return x.to(torch.float64)


def result_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype torch gives a unary float op's result: x's, or the default float for integers."""
    return x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()


def in_float64(function: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A unary op evaluated by ``function`` in float64, its result in torch's result dtype."""

    def op(x: torch.Tensor) -> torch.Tensor:
        return function(as_float64(x)).to(result_dtype(x))

    op.__wrapped__ = function
    return op
