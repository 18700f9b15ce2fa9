"""Running one aten op on a turbine device: routing, and the plan cache.

``DeviceTensor.__torch_dispatch__`` calls :func:`handle`. Each op is routed once, by its entry
in the op registry (eager/registry.py) or its kind: a registered handler; one op per list
element for ``_foreach_``; torch's own decomposition for a composite op; else a plan.

An op call is walked into a key (op, each tensor's shape/dtype/layout, compiled-in constants,
the kinds of runtime scalars, the device). The first call with a key builds a plan
(eager/planning.py), or takes it from a record saved by an earlier process; later calls run it.
"""

from __future__ import annotations

import atexit
from typing import Any, Callable

import torch

from turbine.config import on_change
from turbine.eager import ops  # noqa: F401  (its declarations fill the op registry)
from turbine.eager import backward_errors, custom_ops, dynamo_rules, foreach, planning, registry, runtime, saved_plans, whole_calls
from turbine.eager.host import device_of
from turbine.eager.meta import meta_call, on_cpu_zeros
from turbine.eager.plans import FallbackPlan
from turbine.eager.kernel_plan import KernelPlan
from turbine.eager.registry import Continue
from turbine.eager.schema import OpSchema, schema_of
from turbine.eager.signature import Leaves, walk, walk_tensors
from turbine.eager.tensor import empty
from turbine.errors import CompileError, UnsupportedLayoutError, UnsupportedOpError

_schemas: dict[Any, OpSchema] = {}


def handle(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """``DeviceTensor.__torch_dispatch__``: run the op; inside a backward call, a failure is held
    until the backward returns (eager/backward_errors.py) and autograd gets a stand-in."""
    if dynamo_rules.in_compiled_function():  # an op torch.compile left to run eagerly
        return dynamo_rules.outside_dynamo(_handle, func, args, kwargs)
    return _handle(func, args, kwargs)


def _handle(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    try:
        return run(func, args, kwargs)
    except Exception as error:
        if not backward_errors.active():
            raise
        return backward_errors.hold(error, lambda: stand_in(func, args, kwargs))


def run(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on turbine tensors; the result is made of new or updated DeviceTensors."""
    routes = runtime.state.routes
    route = routes.get(func)
    if route is None:
        route = routes[func] = _route(func)
    if whole_calls.observing:
        whole_calls.note_route(route is plan_and_run or route is _decompose)
    return route(func, args, kwargs)


def _route(func: Any) -> Callable:
    """How an op runs: its registered handler, one op per list element for ``_foreach_``,
    torch's own decomposition for a composite op, a Python custom op's own body, else a plan."""
    handler = registry.handler(func)
    if handler is not None:
        return _with_handler(handler)
    if func.overloadpacket.__name__.startswith("_foreach_"):
        return foreach.run
    if func._can_decompose():
        return _decompose
    own = custom_ops.body(func)
    if own is not None:
        return custom_ops.runner(own, plan_and_run)
    return plan_and_run


def route_name(func: Any) -> str:
    """Which way :func:`run` sends ``func`` (for ``python -m turbine explain``)."""
    route = _route(func)
    if route is foreach.run:
        return "foreach: one op per list element, each dispatched as its own call"
    if route is _decompose:
        return "composite: torch's own decomposition into the ops it is defined with (CompositeImplicitAutograd)"
    if route is plan_and_run:
        return "planned: meta call, then a kernel, view, mutation or empty plan by what the op does"
    if getattr(route, "custom_body", False):
        return "custom: its own Python body (torch.library.custom_op) on turbine tensors, else planned"
    return "handler: the registry's handler runs first (it may go on the planned way)"


def _with_handler(handler: Callable) -> Callable:
    def handled(func: Any, args: tuple, kwargs: dict) -> Any:
        result = handler(func, args, kwargs)
        if type(result) is Continue:
            return plan_and_run(func, result.args, result.kwargs)
        return result

    return handled


def _decompose(func: Any, args: tuple, kwargs: dict) -> Any:
    """A CompositeImplicitAutograd op (``to.dtype_layout``, ``linear``) as the ops torch defines
    it with. Autograd decomposes these before they reach a device; under ``torch.inference_mode``
    autograd is skipped and they arrive whole."""
    return func.decompose(*args, **kwargs)


def _schema(func: Any) -> OpSchema:
    """The op's schema (a dict lookup on the hot path)."""
    return _schemas.get(func) or _schemas.setdefault(func, schema_of(func))


def plan_and_run(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` through the plan its key selects, building the plan on the first call."""
    leaves = None if kwargs else walk_tensors(func, args)
    if leaves is None:
        leaves = walk(func, _schema(func), args, kwargs)
    # A plan holds kernels loaded on one device, so the device is part of its key (the kernel
    # cache shares compiled modules between devices of one target by itself).
    key = (*leaves.key, leaves.device.index if leaves.device is not None else None)
    plan = runtime.state.plans.get(key)
    if plan is None:
        plan = _new_plan(func, _schema(func), args, kwargs, leaves, key)
    if whole_calls.observing:
        whole_calls.note_plan(plan)
    return plan(leaves, args, kwargs)


def _new_plan(func: Any, schema: OpSchema, args: tuple, kwargs: dict, leaves: Leaves, key: tuple) -> Callable:
    """A key's plan, kept in the plan cache: from its saved record if a file has one, else built."""
    record = saved_plans.take(key, leaves.device) if leaves.device is not None else None
    try:
        plan = planning.from_record(func, schema, leaves, record, run) if record is not None else None
    except (ValueError, TypeError, KeyError, IndexError):
        plan = None  # a record of another layout (a file edited by hand): built as if it had none
    if plan is None:
        try:
            plan = planning.build_plan(func, schema, args, kwargs, leaves, run)
        except (CompileError, UnsupportedOpError) as reason:
            if schema.aliased_output and not schema.written or isinstance(reason, UnsupportedLayoutError):
                raise  # a copy made by torch would not alias the input as a view must; no executor makes a sparse result
            plan = FallbackPlan(func, reason, leaves.device)
        saved_plans.built()
    plans = runtime.state.plans
    plans[key] = plan
    kernel_plan = plan if isinstance(plan, KernelPlan) else getattr(plan, "kernel_plan", None)
    if kernel_plan is not None:  # itself or inside a timed or relaid plan
        kernel_plan.forget = lambda: plans.pop(key, None)
    return plan


def stand_in(func: Any, args: tuple, kwargs: dict) -> Any:
    """What a failed call inside backward hands autograd (eager/backward_errors.py).

    Ops that write their arguments return those; others, uninitialised tensors of the result's
    shapes: from torch's shape rule, or for an op with none (_masked_softmax_backward) from
    its run on zeros on the CPU.
    """
    schema = _schema(func)
    if schema.out_names:
        outs = [kwargs[name] for name in schema.out_names]
        return outs[0] if len(outs) == 1 else tuple(outs)
    if schema.written:
        return args[schema.written[0]]
    device = device_of(args, kwargs)
    try:
        meta_out = meta_call(func, schema, args, kwargs)
    except UnsupportedOpError:
        meta_out = on_cpu_zeros(func, schema, args, kwargs)
    return backward_errors.uninitialised_like(meta_out, lambda m: empty(tuple(m.shape), m.dtype, device))


def clear_plans() -> None:
    """Forget every plan, the factories' kernels, the saved plans read so far and the shape
    families learnt (tests use it to show that kernels, plans and families come back from disk)."""
    runtime.state.plans.clear()
    runtime.state.whole_calls.clear()
    runtime.state.not_whole.clear()
    runtime.state.factory_kernels.clear()
    runtime.state.families.clear()
    saved_plans.forget()


def _forget_executor_choices() -> None:
    """Forget the plans and whole-call verdicts made under the executors switch's old value: a
    signature planned for IREE alone would otherwise keep IREE after the vendor is let in."""
    runtime.state.plans.clear()
    runtime.state.whole_calls.clear()


on_change("executors", _forget_executor_choices)


def plans() -> dict[tuple, Callable]:
    """The plan cache of the runtime in use (tests read it)."""
    return runtime.state.plans


atexit.register(lambda: saved_plans.save(runtime.state.plans))
