"""Ops defined in Python with ``torch.library.custom_op``: their own body, run on turbine tensors.

A library that defines an op in Python gives it a body of torch calls that runs on any device:
torch's ``F.linear_cross_entropy`` chunks its batch in one (``torch_nn::`` ops), transformers
has its grouped matmul fallback. Planned whole, such an op could only be traced as one opaque
call, which IREE cannot compile, so every call went to the fallback policy (torch's kernel over
the device memory, which is that same body on torch tensors). turbine runs the body itself with
the DeviceTensors instead, so each op in it is planned like any other.

Only ops that write none of their arguments: should the body fail on turbine tensors (a call
into a C++ extension, a raw pointer), the call runs again the planned way, its fallback included,
where it must not apply a write twice (a body that draws random numbers draws them again there). A body registered for one
device type only (``device_types="cuda"``) is not run: that op keeps the planned way.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch._library.custom_ops import _maybe_get_opdef
from torch.utils._pytree import tree_flatten

from turbine.eager.schema import schema_of
from turbine.eager.tensor import DeviceTensor

log = logging.getLogger("turbine")


def body(func: torch._ops.OpOverload) -> Callable | None:
    """The body a Python custom op runs on every device, None for any other op (or one that
    writes its arguments)."""
    if func.namespace in ("aten", "prims"):
        return None
    opdef = _maybe_get_opdef(func)
    if opdef is None:
        return None
    schema = schema_of(func)
    if schema.written or schema.aliased_output:
        return None
    return getattr(opdef, "_backend_fns", {}).get(None)  # torch keeps the device-type-free body under None


def runner(func_body: Callable, planned: Callable) -> Callable:
    """The route of an op with a body: the body on the call's own tensors. Should it raise, the
    call runs the planned way (``planned``: its fallback runs the body on torch's tensors over
    the device memory), and if that raises at once too, the body's error is raised (its words
    are torch's, the body being the same code). Each call tries the body first: whether a body
    runs on turbine tensors can depend on the call, and a planned call's kernel may compile in
    the background, so its failure is not known when it returns."""

    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            result = func_body(*args, **kwargs)
        except Exception as error:
            log.debug("turbine: %s's Python body did not run on turbine tensors (%s: %s); the planned way runs it", func, type(error).__name__, error)
            try:
                return planned(func, args, kwargs)
            except Exception:
                raise error from None
        _check_no_alias(func, args, kwargs, result)
        return result

    run.custom_body = True  # for dispatch.route_name
    return run


def _check_no_alias(func: Any, args: tuple, kwargs: dict, result: Any) -> None:
    """torch's rule for a custom op's results: none is an input or a view of one (torch checks it
    as it runs the body on its own devices; a result that aliased its input would let a write to
    it change the input)."""
    inputs = {_memory(t) for t in _tensors((args, kwargs))}
    if any(_memory(t) in inputs for t in _tensors(result)):
        raise RuntimeError(
            f"{func}: The output of this custom operator (1) must not also be an input to this custom operator and "
            "(2) may not alias any inputs to this custom operator or other returns. Please instead return a clone of "
            "the offending output tensor(s) (e.g. return x.clone()) or refactor the custom operator to not return y."
        )


def _tensors(value: Any) -> list[DeviceTensor]:
    """The turbine tensors in ``value`` (nested tuples, lists, dicts)."""
    return [t for t in tree_flatten(value)[0] if isinstance(t, DeviceTensor)]


def _memory(tensor: DeviceTensor) -> int:
    """Which memory a tensor views: its storage's (a complex storage's real view: its base's)."""
    storage = tensor._storage
    return id(getattr(storage, "base", storage))
