"""Ops defined in Python with ``torch.library.custom_op``: their own body, run on turbine tensors.

A library that defines an op in Python gives it a body of torch calls that runs on any device:
torch's ``F.linear_cross_entropy`` chunks its batch in one (``torch_nn::`` ops), transformers
has its grouped matmul fallback. Planned whole, such an op could only be traced as one opaque
call, which IREE cannot compile, so every call went to the fallback policy (torch's kernel over
the device memory, which is that same body on torch tensors). turbine runs the body itself with
the DeviceTensors instead, so each op in it is planned like any other.

Only ops that write none of their arguments: should the body fail on turbine tensors (a call
into a C++ extension, a raw pointer), the op goes the planned way from then on, its fallback
included, and running it again there must not apply a write twice. A body registered for one
device type only (``device_types="cuda"``) is not run: that op keeps the planned way.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch._library.custom_ops import _maybe_get_opdef

from turbine.eager.schema import schema_of

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


def runner(func_body: Callable, planned: Callable, routes: dict) -> Callable:
    """The route of an op with a body: the body on the call's own tensors, or, if that raises,
    the planned way (``planned``), which that op keeps from then on (in ``routes``)."""

    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return func_body(*args, **kwargs)
        except Exception as error:  # noqa: BLE001  (torch's error, if real, comes again from the planned way)
            log.info("turbine: %s's Python body did not run on turbine tensors (%s: %s); it goes the planned way", func, type(error).__name__, error)
            routes[func] = planned
            return planned(func, args, kwargs)

    return run
