"""``_foreach_*`` ops (what optimizers' ``foreach=True`` paths call) as one op per list element.

``_foreach_addcdiv_.ScalarList(params, t1, t2, scalars)`` runs ``addcdiv(params[i], t1[i], t2[i],
value=scalars[i])`` for each i and writes each result into ``params[i]``. Each element op goes
through turbine's dispatch like any other, so its numbers stay runtime inputs and its kernels
are shared with the single-tensor path.

The element op is the overload of the op's out-of-place packet whose arguments line up with
the foreach op's: a list of tensors or of scalars with one tensor or scalar, a single value with
the same value, and a 1-D ``scalars`` tensor (``_foreach_addcdiv_.Tensor``) with its i-th element.
In-place foreach ops write the element results into their first list, as torch's do.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from turbine.counters import counters
from turbine.eager import executors
from turbine.eager.executors.torch_kernel import TorchBuffer, adopt, as_it_is
from turbine.eager.tensor import DeviceTensor
from turbine.eager.views import write
from turbine.errors import DeviceError, UnsupportedOpError

aten = torch.ops.aten

#: Foreach ops whose element op takes its arguments in another order or under other names.
_IRREGULAR: dict[str, Callable[..., torch.Tensor]] = {
    "norm": lambda tensor, ord=2, dtype=None: aten.linalg_vector_norm.default(tensor, ord, dtype=dtype),
    "max": lambda tensor: aten.max.default(tensor),
}


def run(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run a ``_foreach_`` op element by element; in-place ones write their first list.

    Where the vendor executor runs (a GPU), the op runs whole as torch's multi-tensor kernel
    instead: one launch for the list rather than one per element, which is what makes torch's
    foreach optimizers fast on CUDA."""
    name = func.overloadpacket.__name__[len("_foreach_") :]
    in_place = name.endswith("_")
    values = _bound(func, args, kwargs)
    whole = _on_the_vendor(func, values, args, kwargs)
    if whole is not None:
        results, stream = whole
        device = values[0][0]._storage.device
        if not in_place:
            return [adopt(r, device, stream) for r in results]
        for target, result in zip(values[0], results):
            if target._dense and result.shape == target.shape and result.dtype == target.dtype and as_it_is(result):
                target._storage.buffer = TorchBuffer(device, result, stream)  # as write() would, minus a tensor
            else:
                _write(target, adopt(result, device, stream))
        return None
    arguments = func._schema.arguments
    per_element = [_per_element(argument) for argument in arguments]
    count = next(len(v) for v, each in zip(values, per_element) if each == "list")
    if name.rstrip("_") == "copy":  # copy_(self, src, non_blocking): write src into self
        for target, source in zip(values[0], values[1]):
            target.copy_(source)
        return None
    element = _IRREGULAR.get(name.rstrip("_")) or _element_op(func)
    results = []
    for i in range(count):
        element_args = [_element(v, each, i) for v, each in zip(values, per_element)]
        results.append(element(*element_args))
    if in_place:
        for target, result in zip(values[0], results):
            _write(target, result)
        return None
    return results


def _on_the_vendor(func: torch._ops.OpOverload, values: list, args: tuple, kwargs: dict) -> tuple[list, tuple | None] | None:
    """The op's out-of-place form run whole by the vendor executor: torch's results and the key
    of their stream; None where it does not run on these tensors' device (or torch has no kernel
    for them: then element by element)."""
    first = values[0][0] if isinstance(values[0], (list, tuple)) and values[0] else None
    whole = _out_of_place(func)
    if whole is None or not isinstance(first, DeviceTensor) or not executors.VENDOR.runs_on(first._storage.device):
        return None
    try:
        results, stream = executors.VENDOR.run_torch(whole, args, kwargs, first._storage.device)
    except DeviceError:
        raise  # a lost device: not a call torch has no kernel for
    except Exception:  # no torch kernel for these dtypes here: element by element instead
        return None
    counters.executors[executors.VENDOR.name] += 1
    return list(results), stream


@functools.lru_cache(maxsize=None)
def _out_of_place(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The foreach op's out-of-place overload of the same name (itself, for an out-of-place op),
    which the vendor runs whole; None where there is none, and for copy (written element-wise)."""
    name = func.overloadpacket.__name__.rstrip("_")
    packet = getattr(aten, name, None)
    if packet is None or name == "_foreach_copy" or func._overloadname not in packet.overloads():
        return None
    return getattr(packet, func._overloadname)


def _bound(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list:
    """The call's arguments in schema order, defaults filled in."""
    values = list(args)
    if len(values) == len(func._schema.arguments):  # all given by position: nothing to fill in
        return values
    for argument in func._schema.arguments[len(args) :]:
        if argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            raise TypeError(f"{func} is missing its argument {argument.name!r}")
    return values


def _kind(type_: torch._C.JitType) -> tuple[bool, str]:
    """(is a list, element kind): the kind is 'tensor', 'number' or the type's own name."""
    if isinstance(type_, torch._C.OptionalType):
        type_ = type_.getElementType()
    listed = isinstance(type_, torch._C.ListType)
    if listed:
        type_ = type_.getElementType()
    if isinstance(type_, torch._C.TensorType):
        return listed, "tensor"
    if isinstance(type_, (torch._C.NumberType, torch._C.FloatType, torch._C.IntType)):
        return listed, "number"
    return listed, str(type_)


def _per_element(argument: torch._C.Argument) -> str:
    """How an argument reaches each element op: 'list' (element i), 'scalars' (element i of a
    1-D tensor), or 'same' (as it is)."""
    listed, kind = _kind(argument.type)
    if listed and kind in ("tensor", "number"):
        return "list"
    if argument.name == "scalars" and kind == "tensor":
        return "scalars"
    return "same"


def _element(value: Any, each: str, i: int) -> Any:
    if each == "list":
        return value[i]
    if each == "scalars":
        return value[i].item()  # one scalar per element; the element op takes it as a number
    return value


@functools.lru_cache(maxsize=None)
def _element_op(func: torch._ops.OpOverload) -> Callable[..., torch.Tensor]:
    """The out-of-place overload whose arguments line up with ``func``'s, called with them by position."""
    base = func.overloadpacket.__name__[len("_foreach_") :].rstrip("_")
    packet = getattr(aten, base, None)
    if packet is None:
        raise UnsupportedOpError(f"{func}: turbine found no element op aten.{base}")
    mine = func._schema.arguments
    for overload_name in packet.overloads():
        overload = getattr(packet, overload_name)
        theirs = overload._schema.arguments
        written = any(a.alias_info is not None and a.alias_info.is_write for a in theirs)
        if written or len(theirs) < len(mine):
            continue
        if all(_lines_up(m, t) for m, t in zip(mine, theirs)) and all(t.has_default_value() for t in theirs[len(mine) :]):
            return _positional(overload)
    raise UnsupportedOpError(f"{func}: turbine found no overload of aten.{base} that takes its element arguments")


def _lines_up(mine: torch._C.Argument, theirs: torch._C.Argument) -> bool:
    """Whether an element of the foreach argument ``mine`` fits the element op's argument ``theirs``."""
    mine_listed, kind = _kind(mine.type)
    theirs_listed, other = _kind(theirs.type)
    if _per_element(mine) == "scalars":
        kind = "number"
    elif not mine_listed and theirs_listed:
        return False
    return kind == other


def _positional(overload: torch._ops.OpOverload) -> Callable[..., torch.Tensor]:
    """``overload`` called with its arguments by position, keyword-only ones passed by name."""
    names = [a.name for a in overload._schema.arguments]
    keyword = [a.kwarg_only for a in overload._schema.arguments]

    def call(*values: Any) -> torch.Tensor:
        positional = [v for v, k in zip(values, keyword) if not k]
        named = {n: v for n, v, k in zip(names, values, keyword) if k}
        return overload(*positional, **named)

    return call


def _write(target: torch.Tensor, result: torch.Tensor) -> None:
    """An in-place foreach op's element result into its target (a new buffer, no kernel, where
    shape and dtype agree)."""
    if result.shape == target.shape and result.dtype == target.dtype:
        write(target, result)
    else:
        target.copy_(result)
