"""What dispatch needs to know about an aten op's schema, computed once per op overload.

Each argument gets a kind that decides how it enters a kernel signature:
- TENSOR / TENSOR_LIST: device tensors become kernel inputs (shape and dtype in the signature);
  a Python number or 0-d CPU tensor in a tensor slot becomes a runtime 0-d input;
- SCALAR: a ``Scalar`` argument: a runtime 0-d input (a learning rate, ``addcdiv``'s ``value``,
  ``leaky_relu``'s slope, ``full``'s fill value), unless its value changes the kernel's code
  (``COMPILED_IN``) or it is a bool. The kernel takes it through the op's ``.Tensor`` twin
  where the op has one (``mul.Scalar`` as ``mul.Tensor``), else as a traced ``.item()`` of the
  0-d input, which IREE imports as a runtime number;
- CONST: everything else (ints, int lists, floats, dtypes, bools, strings) is compiled in.
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
    """Argument kinds by position and name, plus how the op's Scalars become runtime inputs."""

    kinds: tuple[str, ...]
    names: tuple[str, ...]
    kind_by_name: dict
    #: SCALAR arguments passed as runtime 0-d inputs, by name: True, or a function of the value
    #: that says which values are compiled in after all (pow's exponent 2; bools of ``symbolic``
    #: ones). The traced op takes a runtime scalar as the 0-d tensor (its twin's Tensor slot,
    #: add's folded alpha) or, for ``symbolic`` ones, as a number.
    runtime_scalars: dict
    twin: torch._ops.OpOverload | None  # the overload that takes those Scalars as tensors
    #: Runtime SCALAR arguments the traced op takes as numbers: ``.item()`` of their 0-d input.
    symbolic: frozenset
    written: tuple[int, ...]  # positions of arguments the op writes (in-place and out=)
    out_names: tuple[str, ...]  # kwarg-only arguments it writes (out=)
    aliased_output: bool  # the op returns a view of an input


#: exponents torch's pow kernels compute with other code (x * x, sqrt, reciprocal, ...), which
#: give torch's exact results where exp(log(x) * y) would be an ulp or two off.
_SPECIAL_EXPONENTS = frozenset({-2, -1, -0.5, 0, 0.5, 1, 2, 3})

#: Scalar arguments compiled into the kernel, by op and argument name: True, or a function of the
#: value that says which values are. Their value picks the algorithm (a norm's order, pow's special
#: exponents), or torch's shape rule for the op branches on it, so no trace can take it as a
#: runtime input (``addmm``'s ``beta == 0`` ignores NaNs in ``self``; ``index_add``'s ``alpha``;
#: ``var``'s ``correction``), or IREE 3.13 cannot compile the op with a runtime value
#: (``hardshrink``); ``arange``'s bounds fix its result's shape.
COMPILED_IN: dict[str, dict[str, object]] = {
    "pow": {"exponent": lambda value: value in _SPECIAL_EXPONENTS},
    "norm": {"p": True},
    "linalg_vector_norm": {"ord": True},
    "dist": {"p": True},
    "renorm": {"p": True},
    "multi_margin_loss": {"p": True},
    "multi_margin_loss_backward": {"p": True},
    "addmm": {"beta": True, "alpha": True},
    "addmv": {"beta": True, "alpha": True},
    "addr": {"beta": True, "alpha": True},
    "addbmm": {"beta": True, "alpha": True},
    "baddbmm": {"beta": True, "alpha": True},
    "_addmm_activation": {"beta": True, "alpha": True},
    "index_add": {"alpha": True},
    "var": {"correction": True},
    "std": {"correction": True},
    "var_mean": {"correction": True},
    "std_mean": {"correction": True},
    "hardshrink": {"lambd": True},
    "softshrink": {"lambd": True},
    "arange": {"start": True, "end": True, "step": True},
    "histc": {"min": True, "max": True},  # turbine's decomposition bins the data's own range when min == max
}


def _bool_or(rule: object) -> object:
    """A compiled-in rule that also compiles in bools (True or False: two kernels at most)."""
    if rule is False:
        return lambda value: type(value) is bool
    return lambda value: type(value) is bool or rule(value)


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
    scalar_names = [a.name for a, k in zip(args, kinds) if k == SCALAR]
    packet = func.overloadpacket.__name__.rstrip("_")
    compiled_in = COMPILED_IN.get(packet, {})
    # A twin takes its Scalars as tensors, so an op with a Scalar that is always compiled in has
    # none; one compiled in for some values (pow's exponent 2) traces the op itself for those.
    always = {name for name, rule in compiled_in.items() if rule is True}
    twin = _twin(func, kinds) if set(scalar_names) - {"alpha"} and not always else None
    # add/sub's alpha scales the operand in the trace (traced_call._fold_alpha); a twin takes the
    # other Scalars as tensors; the rest are traced as numbers.
    folded = {"alpha"} if packet in ("add", "sub", "rsub") else set()
    traced_kinds = {a.name: _kind(a.type) for a in (twin or func)._schema.arguments}
    runtime: dict = {}
    symbolic = set()
    for name in scalar_names:
        rule = compiled_in.get(name, False)
        if rule is True:
            continue
        if traced_kinds.get(name) == SCALAR and name not in folded:
            symbolic.add(name)
            runtime[name] = _bool_or(rule)  # a traced bool would be a symbolic bool, which IREE does not import
        else:
            runtime[name] = rule or True
    written = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
    out_names = tuple(args[i].name for i in written if args[i].kwarg_only)
    aliased = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
    return OpSchema(
        kinds=kinds,
        names=names,
        kind_by_name=dict(zip(names, kinds)),
        runtime_scalars=runtime,
        twin=twin,
        symbolic=frozenset(symbolic),
        written=written,
        out_names=out_names,
        aliased_output=aliased,
    )


def bound_arguments(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by name (those it gives), for a handler to read and rewrite; it
    hands them on through :func:`as_call`."""
    return dict(zip(schema_of(func).names, args)) | kwargs


def as_call(func: torch._ops.OpOverload, named: dict) -> tuple[tuple, dict]:
    """Arguments by name as a call of ``func``: positional where its schema allows (a gap before
    a given one takes the schema's default), keyword-only ones as keywords. Not all keywords:
    a lowering written in Python (torch's decompositions) takes aten's positions, but does not
    always name its parameters as aten does (``input`` for ``self``)."""
    positional = [argument for argument in func._schema.arguments if not argument.kwarg_only]
    given = [i for i, argument in enumerate(positional) if argument.name in named]
    args = tuple(named.get(argument.name, argument.default_value) for argument in positional[: given[-1] + 1 if given else 0])
    return args, {argument.name: named[argument.name] for argument in func._schema.arguments if argument.kwarg_only and argument.name in named}


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
    elif name.endswith("_"):  # add_, or a Python in-place operator: __iand__ writes what __and__ returns
        dunder = name.startswith("__i") and name.endswith("__")
        packet = getattr(torch.ops.aten, f"__{name[3:]}" if dunder else name[:-1], None)
        if packet is None:
            return None
    else:
        return None
    mine = _arguments(func, exclude=schema.out_names)
    candidates = [func._overloadname] + [o for o in packet.overloads() if o != func._overloadname]
    others = [getattr(packet, name) for name in candidates if name in packet.overloads()]
    others = [other for other in others if other is not func and not schema_of(other).written]
    in_order = [other for other in others if _arguments(other) == mine]
    if in_order:
        return in_order[0]
    # The same arguments in another order: polygamma_(self, n) writes polygamma(n, self).
    reordered = [other for other in others if sorted(_arguments(other)) == sorted(mine)]
    return reordered[0] if reordered else None


@functools.lru_cache(maxsize=None)
def functionalized_variant(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The ``*_functional`` twin of an op that writes arguments other than ``out=`` ones and is
    not an in-place op: ``_native_batch_norm_legit`` (it updates running statistics) has
    ``_native_batch_norm_legit_functional``, which returns the op's results followed by the new
    value of each written argument, in order.
    """
    packet = getattr(torch.ops.aten, func.overloadpacket.__name__ + "_functional", None)
    if packet is None:
        return None
    returns = len(func._schema.returns) + len(schema_of(func).written)
    for overload_name in packet.overloads():
        other = getattr(packet, overload_name)
        if len(other._schema.returns) == returns and _arguments(other) == _arguments(func):
            return other
    return None


def _arguments(func: torch._ops.OpOverload, exclude: tuple = ()) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in func._schema.arguments if a.name not in exclude]
