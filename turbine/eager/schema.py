"""What dispatch needs to know about an aten op's schema, computed once per op overload.

Each argument gets a kind that decides how it enters a kernel signature:
- TENSOR / TENSOR_LIST: device tensors become kernel inputs (shape and dtype in the signature);
  a Python number or 0-d CPU tensor in a tensor slot becomes a runtime 0-d input;
- SCALAR: a ``Scalar`` argument. It is a runtime input when the op has a ``.Tensor`` twin that
  takes a tensor in that slot, or when it is add/sub's ``alpha``; otherwise it is compiled in;
- CONST: everything else (ints, int lists, dtypes, bools, strings) is compiled in.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

TENSOR, TENSOR_LIST, SCALAR, CONST = "tensor", "tensor_list", "scalar", "const"


def _kind(type_: torch._C.JitType) -> str:
    if isinstance(type_, torch._C.OptionalType):
        type_ = type_.getElementType()
    if isinstance(type_, torch._C.TensorType):
        return TENSOR
    if isinstance(type_, torch._C.ListType):
        element = type_.getElementType()
        if isinstance(element, torch._C.OptionalType):
            element = element.getElementType()
        if isinstance(element, torch._C.TensorType):
            return TENSOR_LIST
    if isinstance(type_, torch._C.NumberType):
        return SCALAR
    return CONST


@dataclasses.dataclass(frozen=True)
class OpSchema:
    """Argument kinds by position and name, plus how the op's Scalars can become runtime inputs."""

    kinds: tuple[str, ...]
    names: tuple[str, ...]
    kind_by_name: dict
    runtime_scalars: frozenset  # names of SCALAR arguments passed as runtime 0-d inputs
    twin: torch._ops.OpOverload | None  # the overload that takes those Scalars as tensors
    written: tuple[int, ...]  # positions of arguments the op writes (in-place and out=)
    out_names: tuple[str, ...]  # kwarg-only arguments it writes (out=)
    aliased_output: bool  # the op returns a view of an input


def _twin(func: torch._ops.OpOverload, kinds: tuple[str, ...]) -> torch._ops.OpOverload | None:
    """An overload of the same op with Tensor where ``func`` has Scalar, all else equal."""
    args = func._schema.arguments
    for overload_name in func.overloadpacket.overloads():
        other = getattr(func.overloadpacket, overload_name)
        other_args = other._schema.arguments
        if other is func or len(other_args) != len(args):
            continue
        same = True
        for mine, theirs, kind in zip(args, other_args, kinds):
            if mine.name != theirs.name:
                same = False
            elif kind == SCALAR and mine.name != "alpha":
                same = same and _kind(theirs.type) == TENSOR
            elif str(mine.type) != str(theirs.type):
                same = False
        if same and len(func._schema.returns) == len(other._schema.returns):
            return other
    return None


@functools.lru_cache(maxsize=None)
def schema_of(func: torch._ops.OpOverload) -> OpSchema:
    args = func._schema.arguments
    kinds = tuple(_kind(a.type) for a in args)
    names = tuple(a.name for a in args)
    scalar_names = {a.name for a, k in zip(args, kinds) if k == SCALAR}
    # pow keeps its exponent compiled in: IREE gets (-2.0) ** 2 right only for a constant exponent.
    twin = _twin(func, kinds) if scalar_names - {"alpha"} and func.overloadpacket.__name__ not in ("pow", "pow_") else None
    runtime = set()
    if twin is not None:
        runtime |= scalar_names - {"alpha"}
    if "alpha" in scalar_names and func.overloadpacket.__name__.rstrip("_") in ("add", "sub", "rsub"):
        runtime.add("alpha")
    written = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
    out_names = tuple(args[i].name for i in written if args[i].kwarg_only)
    aliased = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
    return OpSchema(
        kinds=kinds,
        names=names,
        kind_by_name=dict(zip(names, kinds)),
        runtime_scalars=frozenset(runtime),
        twin=twin,
        written=written,
        out_names=out_names,
        aliased_output=aliased,
    )


@functools.lru_cache(maxsize=None)
def functional_variant(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The out-of-place overload computing what an in-place (``add_``) or ``out=`` op writes.

    It is the overload of the op's out-of-place packet that takes the same arguments (the ``out=``
    ones aside). Overload names do not always line up: ``pow_.Scalar`` is ``pow.Tensor_Scalar``.
    Kept per op: every plan of an in-place op asks (an SGD step's ``add_`` on six shapes: six).
    """
    name = func.overloadpacket.__name__
    schema = schema_of(func)
    if schema.out_names:
        packet = func.overloadpacket
    elif name.endswith("_"):
        packet = getattr(torch.ops.aten, name[:-1], None)
        if packet is None:
            return None
    else:
        return None
    mine = _arguments(func, exclude=schema.out_names)
    candidates = [func._overloadname] + [o for o in packet.overloads() if o != func._overloadname]
    for overload_name in candidates:
        if overload_name not in packet.overloads():
            continue
        other = getattr(packet, overload_name)
        if other is not func and not schema_of(other).written and _arguments(other) == mine:
            return other
    return None


def _arguments(func: torch._ops.OpOverload, exclude: tuple = ()) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in func._schema.arguments if a.name not in exclude]
