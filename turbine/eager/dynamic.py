"""Which dims of a kernel are dynamic: one kernel for the sizes a dim takes, not one per size.

Calls of an op that differ only in their tensors' sizes (same dtypes, ranks, constants) form a
family. The first call compiles a kernel for its sizes. When a later call has another size at a
dim where both sizes are 2 or more, that dim becomes dynamic for the family: its kernel is
compiled once with the dim unknown, and every later size there reuses it (torch.compile's rule:
dynamic after the first change). Each dynamic dim is its own symbol unless the op's shape rules
need two equal (bmm's inner dims): the trace says so and the family remembers it, so sizes that
are equal by chance (a sequence length that reaches the head size) compile nothing new. A
dynamic kernel is traced for sizes of 2 or more (torch's shape rules branch on a 1: broadcasting,
strides), so a call with a 1 at a dynamic dim runs on it only where the op's program at that size
is the dynamic one's (op_trace._serves); else, and for a 0, the call gets a kernel for its own
sizes. A size of 1 then a larger one is a change like any other. A family whose lowering
would branch on a dynamic size (tracing.py refuses it) stays static. What a family decided is
kept in the kernel cache, so a new process compiles nothing for sizes it has not seen.

Kernels whose sizes are arguments rather than inputs' dims (gathering or writing a strided view,
a ``torch.full`` of given sizes) follow the same rule through :func:`generic`: one kernel per
kind, rank and dtype, which takes its sizes from a zero-element input and its strides as values.

``TURBINE_DYNAMIC`` (``config.dynamic``): ``auto`` (the rule above, the default), ``off`` (a
kernel per size) or ``all`` (every dim of size 2 or more dynamic from the first call); :func:`mark_dynamic` makes a
tensor's dim dynamic from the first call, as ``torch._dynamo.mark_dynamic`` does.
"""

from __future__ import annotations

from typing import Any, Iterable

from turbine.config import choice
from turbine.device import Device
from turbine.eager import runtime
from turbine.eager.signature import Leaves
from turbine.eager.tensor import DeviceTensor
from turbine.kernels_cache import kernel_cache
from turbine.kernels_cache.tracing import Dynamic

#: The values ``TURBINE_DYNAMIC`` takes.
MODES = ("auto", "off", "all")

Dims = frozenset  # of (tensor position, dim)


def mode() -> str:
    """``config.dynamic``, checked."""
    return choice("dynamic", MODES)


def mark_dynamic(tensor: DeviceTensor, dims: int | Iterable[int]) -> DeviceTensor:
    """Compile the kernels of ops on ``tensor`` with ``dims`` dynamic from their first call (where
    the size there is 2 or more); returns the tensor. Results of ops do not inherit the mark."""
    if not isinstance(tensor, DeviceTensor):
        raise TypeError(f"turbine.mark_dynamic takes a turbine tensor, not {type(tensor).__name__}")
    dims = [dims] if isinstance(dims, int) else list(dims)
    rank = tensor.dim()
    for dim in dims:
        if not -rank <= dim < rank:
            raise IndexError(f"turbine.mark_dynamic: dim {dim} is out of range for a tensor of {rank} dims")
    tensor._dynamic_dims = frozenset(tensor._dynamic_dims) | {d % rank for d in dims}
    return tensor


class Family:
    """What the calls of one family taught: the first call's sizes, the dims found dynamic, the
    groups of them its ops need equal, and whether a dynamic kernel was refused (then the family
    stays static). ``from_one``: dims made dynamic by a 1 then a larger size, until a kernel
    compiles with them (a 1 may have been a broadcast)."""

    __slots__ = ("first", "dims", "equal", "refused", "from_one")

    def __init__(self, dims: Dims = Dims(), equal: tuple = (), refused: bool = False) -> None:
        self.first: list[list[int]] | None = None
        self.dims = dims
        self.equal: tuple[Dims, ...] = equal
        self.refused = refused
        self.from_one: set = set()


def family_key(signature: tuple, slots: list[int]) -> tuple:
    """A kernel signature with each tensor's sizes replaced by its rank (``slots``: where the
    tensors' keys are in it)."""
    key = list(signature)
    for slot in slots:
        sizes, *rest = key[slot]
        key[slot] = ("rank", len(sizes), *rest[:1])
    return ("dynamic family", *key)


def dims_for(leaves: Leaves, signature: tuple, slots: list[int]) -> Dims | None:
    """The dims to compile this call's kernel with as dynamic, or None for a static kernel."""
    chosen = mode()
    if not leaves.tensors:
        return None
    sizes = tuple(tuple(t.shape) for t in leaves.tensors)
    marked = Dims((i, d) for i, t in enumerate(leaves.tensors) for d in t._dynamic_dims)
    if chosen == "off" and not marked:
        return None  # off: only what the user marked is dynamic
    family = _family(family_key(signature, slots), leaves.device)
    if family.refused:
        return None
    if chosen == "all":
        found = Dims((i, d) for i, s in enumerate(sizes) for d, size in enumerate(s) if size >= 2)
    elif chosen == "off":
        found = Dims()
    else:
        found = _changed(family, sizes)
    dims = family.dims | found | marked
    if dims != family.dims:
        family.dims = dims
        _keep(signature, slots, leaves.device, family)
    if not dims or any(sizes[i][d] == 0 for i, d in dims):
        return None  # a 0 at a dynamic dim: this call's sizes get their own kernel
    return dims  # a 1 there is served only where shown right (op_trace._serves)


def _changed(family: Family, sizes: tuple) -> Dims:
    """The dims where this call's size (2 or more) differs from the first size the family saw
    there; a 0 is not remembered, and a 1 then a larger size is a change (the usual first batch
    of a notebook, then the real ones)."""
    if family.first is None:
        family.first = [list(s) for s in sizes]
        return Dims()
    changed = set()
    for i, (seen, new) in enumerate(zip(family.first, sizes)):
        for d, size in enumerate(new):
            if size < 2:
                continue
            if seen[d] == 0:
                seen[d] = size
            elif seen[d] != size:
                changed.add((i, d))
                if seen[d] == 1:
                    family.from_one.add((i, d))
                    seen[d] = size
    return Dims(changed)


def refuse(signature: tuple, slots: list[int], device: Device) -> None:
    """The family's dynamic kernel did not compile: keep it static from now on (and on disk).
    Where dims were made dynamic by a 1 then a larger size, those alone are dropped instead: the
    1 was likely a broadcast (``x[1, 4] + y[5, 4]``, then ``x[5, 4]``), and later sizes may still
    teach the family a kernel it can compile."""
    family = _family(family_key(signature, slots), device)
    if family.from_one:
        family.dims = Dims(family.dims - family.from_one)
        family.from_one.clear()
    else:
        family.refused = True
    _keep(signature, slots, device, family)


def compiled(signature: tuple, slots: list[int], device: Device) -> None:
    """The family's dynamic kernel compiled: every dim it has is one a kernel takes."""
    _family(family_key(signature, slots), device).from_one.clear()


def dynamic_inputs(leaves: Leaves, dims: Dims, signature: tuple, slots: list[int]) -> tuple[list, list, dict] | None:
    """The kernel's tensor inputs with ``dims`` unknown, for the signature and for tracing, and
    each symbol's dims. A dynamic dim is its own symbol, except dims the family found its ops
    need equal (:func:`must_match`), which share one; None if this call's sizes differ there
    (it gets a static kernel)."""
    family = _family(family_key(signature, slots), leaves.device)
    shared = {dim: group for group in family.equal for dim in group}
    names: dict[Any, str] = {}
    symbol_dims: dict[str, list] = {}
    keyed, traced = [], []
    for i, tensor in enumerate(leaves.tensors):
        key_sizes, trace_sizes = [], []
        for d, size in enumerate(tensor.shape):
            if (i, d) in dims:
                symbol = names.setdefault(shared.get((i, d), (i, d)), f"s{len(names)}")
                symbol_dims.setdefault(symbol, []).append((i, d))
                key_sizes.append(symbol)
                trace_sizes.append(Dynamic(symbol, size))
            else:
                key_sizes.append(size)
                trace_sizes.append(size)
        keyed.append(("dynamic", tuple(key_sizes), str(tensor.dtype).removeprefix("torch.")))
        traced.append((tuple(trace_sizes), tensor.dtype))
    sizes = [tuple(t.shape) for t in leaves.tensors]
    if any(len({sizes[i][d] for i, d in group}) > 1 for group in symbol_dims.values()):
        return None
    return keyed, traced, symbol_dims


def must_match(signature: tuple, slots: list[int], device: Device, groups: list[list]) -> None:
    """The family's ops need each of ``groups`` (lists of dims) equal: from now on those dims
    share a symbol (kept on disk with the family)."""
    family = _family(family_key(signature, slots), device)
    merged = [set(g) for g in family.equal] + [set(g) for g in groups]
    changed = True
    while changed:  # join groups that share a dim
        changed = False
        for a in range(len(merged)):
            for b in range(a + 1, len(merged)):
                if merged[a] & merged[b]:
                    merged[a] |= merged.pop(b)
                    changed = True
                    break
            if changed:
                break
    family.equal = tuple(Dims(g) for g in merged)
    _keep(signature, slots, device, family)


def generic(key: tuple, geometry: tuple, device: Device) -> bool:
    """Whether this call of a kernel kind that takes its sizes as arguments (``key``: the kind,
    rank, dtype and what else its kernel compiles in; ``geometry``: this call's sizes, strides,
    offset) runs on the kind's one shape-generic kernel: under ``auto`` once the kind met a second
    geometry, under ``all`` always, under ``off`` never. Kept in the kernel cache like families."""
    chosen = mode()
    if chosen == "off":
        return False
    families = runtime.state.families
    family_key = ("generic family", *key)
    seen = families.get(family_key)
    if seen is None:
        kept = kernel_cache.choice(family_key, device) or {}
        seen = families[family_key] = kept.get("state", geometry)
    if seen == "refused" or (chosen == "auto" and seen == geometry):
        return False
    if seen != "generic":
        families[family_key] = "generic"
        kernel_cache.keep_choice(family_key, device, {"op": str(key[0]), "state": "generic"})
    return True


def refuse_generic(key: tuple, device: Device) -> None:
    """The kind's generic kernel did not compile: its calls keep a kernel per geometry."""
    family_key = ("generic family", *key)
    runtime.state.families[family_key] = "refused"
    kernel_cache.keep_choice(family_key, device, {"op": str(key[0]), "state": "refused"})


def _family(key: tuple, device: Device) -> Family:
    families = runtime.state.families
    family = families.get(key)
    if family is None:
        kept = kernel_cache.choice(key, device) or {}
        dims = Dims(tuple(pair) for pair in kept.get("dims", ()))
        equal = tuple(Dims(tuple(pair) for pair in group) for group in kept.get("equal", ()))
        family = families[key] = Family(dims, equal, bool(kept.get("refused")))
    return family


def _keep(signature: tuple, slots: list[int], device: Device, family: Family) -> None:
    choice: dict[str, Any] = {
        "op": str(signature[0]),
        "dims": sorted(family.dims),
        "equal": [sorted(group) for group in family.equal],
        "refused": family.refused,
    }
    kernel_cache.keep_choice(family_key(signature, slots), device, choice)
