"""The op registry: everything turbine does to an op it treats specially, declared once per op.

An op nobody declared goes the generic way: checked on meta tensors, traced, compiled by IREE,
run as a kernel (eager/dispatch.py). A declaration says how an op leaves that way, and why:

- ``handler``: a function that replaces planning for the op (data movement, ``.item()``, random
  ops drawn on the host so seeds give torch's numbers). It returns the op's result, or
  :class:`Continue` to go on the generic way with the arguments it rewrote;
- ``correction``: what is traced in place of the op, whose IREE lowering is known to be wrong;
- ``decomposition``: what is traced when the op does not compile as it is (turbine's own;
  torch's come from ``torch._decomp``, see :func:`decompositions`);
- ``foreground``: why its kernel must compile before the op returns;
- ``fallback``: the cases known to go to the fallback policy, and why;
- ``traits``: facts the generic way reads (``value_blind``, ``same_elements``, ``native_precision``).

The declarations live by family in eager/ops/ (and eager/decompositions/ for decompositions);
``python -m turbine explain aten.sort.default`` prints an op's entry with the rest of its route.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import marshal
from typing import Any, Callable, Iterable

import torch

OpOverload = torch._ops.OpOverload

#: The traits the generic way reads, with what each means.
TRAITS = {
    "value_blind": "uses its tensor argument for its dtype and device only (runs on empty inputs)",
    "same_elements": "its result is its input's elements in row-major order: a new storage over the input's buffer",
    "writes_by_index": "its result is its first argument with elements written at indices from its other tensors: "
    "where one of those has no elements, nothing is written (a new storage over the first argument's buffer); "
    "its shape rule refuses every call its kernel refuses",
    "native_precision": "computed in its inputs' half precision (not float32 'opmath', as torch's contractions)",
    "reads_row_major": "its kernel reads inputs that lie in another order than row-major (channels-last, transposed) "
    "gathered into row-major order first: IREE compiled it reading them as they lie many times slower",
    "refinement": "its correction makes IREE's right lowering more precise: where the correction does not compile "
    "for a target (a float64 mean on CUDA), the op as it is is traced instead",
}


@dataclasses.dataclass
class OpEntry:
    """What turbine does to one op overload, with the reason for each part."""

    op: OpOverload
    handler: Callable[[Any, tuple, dict], Any] | None = None
    correction: Callable[..., Any] | None = None
    decomposition: Callable[..., Any] | None = None
    foreground: str | None = None
    fallback: str | None = None
    traits: set[str] = dataclasses.field(default_factory=set)
    #: Why, per part declared ("handler", "correction", ...), as the declaration said.
    why: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Continue:
    """A handler's answer: run the op the generic way, on these (rewritten) arguments."""

    args: tuple
    kwargs: dict


_entries: dict[OpOverload, OpEntry] = {}


def overloads(*ops: OpOverload | torch._ops.OpOverloadPacket | str) -> list[OpOverload]:
    """Overloads named by overloads, packets (all their overloads) or ``"packet.overload"`` strings."""
    found = []
    for op in ops:
        if isinstance(op, str):
            packet, name = op.split(".")
            op = getattr(getattr(torch.ops.aten, packet), name)
        if isinstance(op, torch._ops.OpOverloadPacket):
            found += [getattr(op, name) for name in op.overloads()]
        else:
            found.append(op)
    return found


def declare(
    ops: Iterable[Any] | Any,
    why: str,
    *,
    handler: Callable | None = None,
    correction: Callable | None = None,
    decomposition: Callable | None = None,
    foreground: bool = False,
    fallback: bool = False,
    traits: Iterable[str] = (),
) -> None:
    """Declare what turbine does to ``ops`` (one op, or several that share it) and why.

    ``foreground`` and ``fallback`` are flags whose reason is ``why``. An op declared twice for
    the same part is a mistake in the registry, and raises.
    """
    ops = overloads(*(ops if isinstance(ops, (list, tuple, set)) else [ops]))
    parts = {"handler": handler, "correction": correction, "decomposition": decomposition}
    for trait in traits:
        if trait not in TRAITS:
            raise ValueError(f"unknown op trait {trait!r}; known: {', '.join(TRAITS)}")
    for op in ops:
        entry = _entries.setdefault(op, OpEntry(op))
        for part, value in parts.items():
            if value is None:
                continue
            if getattr(entry, part) is not None:
                raise ValueError(f"{op} has two {part}s in turbine's op registry")
            setattr(entry, part, value)
            entry.why[part] = why
        if foreground:
            entry.foreground = entry.why["foreground"] = why
        if fallback:
            entry.fallback = entry.why["fallback"] = why
        for trait in traits:
            entry.traits.add(trait)
            entry.why[trait] = why


def entry(op: OpOverload) -> OpEntry | None:
    """The op's entry, None for an op that goes the generic way."""
    return _entries.get(op)


def entries() -> dict[OpOverload, OpEntry]:
    """Every declared op's entry."""
    return dict(_entries)


def handler(op: OpOverload) -> Callable | None:
    found = _entries.get(op)
    return found.handler if found is not None else None


def correction(op: OpOverload) -> Callable | None:
    found = _entries.get(op)
    return found.correction if found is not None else None


@functools.cache
def lowering_digest(op: OpOverload) -> str | None:
    """A digest of the code of turbine's own lowering of ``op`` (the modules that hold its
    correction and decomposition, and the modules of their package whose helpers they use), or
    None where it has neither; part of its kernels' cache key, so that a kernel, or a failure to
    compile, cached from an older lowering misses."""
    found = _entries.get(op)
    functions = [f for f in (found.correction, found.decomposition) if f is not None] if found is not None else []
    if not functions:
        return None
    digest = hashlib.sha256()
    for text in sorted({text for f in functions for text in _sources(_unwrapped(f))}):
        digest.update(text)
    return digest.hexdigest()[:16]


@functools.cache
def corrections_digest() -> str:
    """A digest of the code of every op's correction: each is traced in place of its op inside
    other ops' kernels too (eager/lowering.py), so every kernel's cache key ends with it and a
    changed correction misses the kernels it may be part of. Read once, at the first kernel
    signature, when turbine.eager.ops has declared them all."""
    corrections = [e.correction for e in _entries.values() if e.correction is not None]
    digest = hashlib.sha256()
    for text in sorted({text for f in corrections for text in _sources(_unwrapped(f))}):
        digest.update(text)
    return digest.hexdigest()[:16]


def _sources(function: Callable) -> set[bytes]:
    """The code of the module that holds ``function`` and of each lowering module it takes a
    helper from, transitively (``order.at_first_nan`` changes argmax's correction too); the
    function's compiled code where there is no module to read (a notebook, a frozen app)."""
    module = inspect.getmodule(function)
    if module is None or _module_source(module.__name__) is None:
        return {marshal.dumps(function.__code__)}
    return {_module_source(name) for name in _helper_modules(module.__name__)}


#: The packages that hold turbine's lowerings: the helpers a lowering's digest follows.
_LOWERING_PACKAGES = ("turbine.eager.decompositions", "turbine.eager.ops")


@functools.cache
def _helper_modules(name: str) -> frozenset[str]:
    """``name`` and the lowering modules it takes names from (a package, its modules), and theirs
    in turn."""
    found, todo = {name}, [name]
    while todo:
        for value in list(vars(importlib.import_module(todo.pop())).values()):
            owner = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
            lowering = isinstance(owner, str) and any(owner == p or owner.startswith(p + ".") for p in _LOWERING_PACKAGES)
            if lowering and owner not in found:
                found.add(owner)
                todo.append(owner)
    return frozenset(found)


@functools.cache
def _module_source(name: str) -> bytes | None:
    try:
        return inspect.getsource(importlib.import_module(name)).encode()
    except (OSError, TypeError):
        return None


def _unwrapped(function: Callable) -> Callable:
    """The function a decorated or partial lowering was written as."""
    function = getattr(function, "__wrapped__", function)
    return getattr(function, "func", function)


def has_trait(op: OpOverload, trait: str) -> bool:
    found = _entries.get(op)
    return found is not None and trait in found.traits


def compiles_in_foreground(op: OpOverload) -> bool:
    found = _entries.get(op)
    return found is not None and found.foreground is not None


#: torch decompositions outside the core-aten set that trace into ops IREE compiles. Chosen by
#: name: the rest of torch's full table also decomposes ops IREE runs as they are (``_to_copy``
#: among them, which the dtype conversions traced into kernels need intact).
MORE_FROM_TORCH = (
    "_batch_norm_with_update", "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "native_batch_norm",
    "max_pool2d_with_indices", "max_pool3d_with_indices",
    "max_pool2d_with_indices_backward", "grid_sampler_2d", "upsample_bicubic2d", "upsample_bilinear2d",
    "upsample_trilinear3d", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "addmv", "dist", "_euclidean_dist", "rrelu_with_noise_backward", "as_strided_copy", "narrow_copy", "permute_copy", "unbind_copy", "view_copy",
)


@functools.lru_cache(maxsize=1)
def torch_decompositions() -> dict:
    """torch's decompositions turbine traces with: the core-aten set, then a few more (max pooling
    with indices, upsampling, the ``*_copy`` ops), through ``torch._decomp``."""
    table = {
        op: fn
        for op, fn in torch._decomp.get_decompositions(list(_torch_table_ops())).items()
        if not fn.__module__.startswith("torch._refs")
    }
    table.update(torch._decomp.core_aten_decompositions())
    return table


def _torch_table_ops() -> Iterable[OpOverload]:
    return (op for op in torch._decomp.decomposition_table if getattr(op, "_opname", None) in MORE_FROM_TORCH)


def decompositions() -> dict:
    """The second try for an op IREE cannot compile as it is: torch's (:func:`torch_decompositions`),
    then turbine's own declared ones, which win. Built on every call: declarations may still come."""
    table = dict(torch_decompositions())
    table.update({op: e.decomposition for op, e in _entries.items() if e.decomposition is not None})
    return table
