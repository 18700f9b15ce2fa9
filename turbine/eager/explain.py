"""What turbine will do with an op, and why: ``python -m turbine explain aten.sort.default``."""

from __future__ import annotations

from typing import Any

import torch

from turbine.device import current
from turbine.eager import dispatch, executors, registry, runtime
from turbine.eager.schema import functional_variant, functionalized_variant, schema_of


def resolve(name: str) -> Any:
    """The op overload a name means: ``aten.sort.default``, ``aten.sort`` (its default overload),
    ``sort.stable``, or ``torch.ops.aten.add.Tensor``; a clear error names the way out."""
    parts = name.removeprefix("torch.ops.").split(".")
    namespace = parts.pop(0) if parts[0] in ("aten", "prims") else "aten"
    try:
        packet = getattr(getattr(torch.ops, namespace), parts[0])
        return getattr(packet, parts[1] if len(parts) > 1 else "default")
    except (AttributeError, IndexError, RuntimeError):
        raise ValueError(
            f"no op {name!r}: name an aten overload such as aten.sort.default or aten.add.Tensor "
            "(python -c \"import torch; print(torch.ops.aten.sort.overloads())\" lists a packet's overloads)"
        ) from None


def explain(func: Any) -> str:
    """A few lines saying how turbine runs ``func``: its route, what its schema makes it, its
    registry entry with the reasons, and who runs it when IREE cannot."""
    lines = [str(func), f"  route: {dispatch.route_name(func)}"]
    lines += [f"  {line}" for line in _schema_lines(func)]
    entry = registry.entry(func)
    if entry is not None:
        lines.append("  declared in the op registry (eager/ops/, eager/decompositions/):")
        for part in ("handler", "correction", "decomposition"):
            value = getattr(entry, part)
            if value is not None:
                lines.append(f"    {part}: {_name(value)}: {entry.why[part]}")
        if entry.foreground:
            lines.append(f"    compiles in the foreground: {entry.foreground}")
        if entry.fallback:
            lines.append(f"    known fallback: {entry.fallback}")
        for trait in sorted(entry.traits):
            lines.append(f"    {trait} ({registry.TRAITS[trait]}): {entry.why[trait]}")
    else:
        lines.append("  not in the op registry: nothing special about it")
    if (entry is None or entry.decomposition is None) and func in registry.torch_decompositions():
        lines.append("  decomposition: torch's (torch._decomp), traced if the op does not compile as it is")
    if registry.handler(func) is not None:
        lines.append("  executors: the handler's own work; the ops it issues go their own routes")
        return "\n".join(lines)
    lines.append(
        f"  vendor: {executors.VENDOR.description} competes with IREE's kernel where TURBINE_EXECUTORS allows "
        "(GPUs by default): both are timed once per signature and the faster runs it"
    )
    lines.append(f"  executors: {executors.IREE.description} first; should IREE not compile it, this thread's fallback policy")
    lines.append("  (TURBINE_FALLBACK, turbine.fallback()) chooses the cheapest of its executors that can run it on the device:")
    device = _cost_device()
    for policy, choices in executors.BY_POLICY.items():
        names = ", ".join(f"{e.name} ({e.description}, cost {e.cost(func, device)})" for e in choices) or "none: the op raises"
        now = " (in force)" if policy == runtime.state.fallback_policy else ""
        lines.append(f"    {policy}{now}: {names}")
    return "\n".join(lines)


def _cost_device() -> Any:
    """The device costs are given for: the current turbine device."""
    return current()


def _schema_lines(func: Any) -> list[str]:
    schema = schema_of(func)
    lines = []
    if schema.written:
        twin = functional_variant(func) or functionalized_variant(func)
        lines.append(f"writes its arguments: runs {twin} and writes the results into them" if twin else
                     "writes its arguments and has no out-of-place twin: the fallback policy runs it")
    elif schema.aliased_output:
        lines.append("returns a view of its input: no kernel, a new geometry over the input's storage")
    if schema.runtime_scalars:
        names = ", ".join(sorted(schema.runtime_scalars))
        lines.append(f"numbers passed at run time, not compiled in: {names}" + (f" (traced as {schema.twin})" if schema.twin else ""))
    return lines


def _name(value: Any) -> str:
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__name__)}"
