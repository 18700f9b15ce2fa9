"""Kernels that read inputs and write results in the memory order torch lays them out in.

A kernel takes dense row-major buffers. A transposed weight (``x @ w.t()``, every ``nn.Linear``'s
gradient) or a channels-last image is dense too, in another order: its buffer is the tensor
permuted into that order, row-major. Such an input was gathered into row-major order before each
call (a kernel of its own: 1.7 ms for a 512x512 transpose on a 2-core CPU, more than the matmul
after it). Its kernel now takes the buffer as it lies and permutes it back inside the traced
function, where the compiler folds the permutation into the op's own loops.

Results likewise: where an input lies in another order and torch lays a result out in another
order (a normalisation, padding or ``cat`` of a channels-last image keeps it channels-last), the
kernel writes the result permuted into that order and the tensor returned is the permutation
back: torch's strides, with no copy. Code reads those strides: ``y.permute(0, 2, 3, 1).view(n,
-1, c)`` of a channels-last ``y`` works in torch. Convolutions and pooling, which IREE 3.13
compiles slowly in other orders, run row-major and have their results copied instead
(eager/relaid_plan.py).

A kernel's signature holds the orders (eager/op_trace.py), so it is compiled for them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager import registry
from turbine.eager.signature import Leaves
from turbine.eager.tensor import DeviceTensor, inverse, memory_order, numel_of

#: Per kernel input or result: the order of dims its buffer lies in, or None for row-major.
Orders = tuple


def input_orders(func: Any, leaves: Leaves) -> Orders | None:
    """Per tensor input, the order of its dims in memory where its buffer holds exactly its
    elements in another order than row-major (the kernel then reads the buffer as it is); None
    where every input is row-major or must be gathered (a slice), and for ops whose kernels
    read other orders slowly (the ``reads_row_major`` trait: convolutions, pooling)."""
    if registry.has_trait(func, "reads_row_major"):
        return None
    orders, found = [], False
    for tensor in leaves.tensors:
        order = None if tensor._dense else _lies_in(tensor)
        found = found or order is not None
        orders.append(order)
    return tuple(orders) if found else None


def _lies_in(tensor: DeviceTensor) -> tuple | None:
    """The order a tensor's buffer holds exactly its elements in, where not row-major."""
    if tensor.storage_offset() != 0 or tensor._storage.numel != numel_of(tuple(tensor.shape)):
        return None
    return _laid_out_in(tensor)


def reads_another_order(leaves: Leaves) -> bool:
    """Whether an input lies densely in another order than row-major: only such calls read an
    input as it lies or write a result in another order (their plans need the meta call: a
    stored kernel, found by sizes alone, would not say)."""
    return any(not tensor._dense and _lies_in(tensor) is not None for tensor in leaves.tensors)


def torch_orders(leaves: Leaves, metas: list) -> Orders | None:
    """Per result (None ones included), the order torch lays it out in where that is not
    row-major, else None; None where no input lies densely in another order (torch's results
    are then row-major too, but for linear algebra's column-major factors, which stay row-major
    here; and results of views with gaps, which stay row-major whether or not a kernel of their
    sizes was stored before)."""
    if not reads_another_order(leaves):
        return None
    found = tuple(None if meta is None else _laid_out_in(meta) for meta in metas)
    return found if any(order is not None for order in found) else None


def output_orders(func: Any, leaves: Leaves, metas: list) -> Orders | None:
    """The orders a kernel writes its results in (:func:`torch_orders`); None for
    ``reads_row_major`` ops, whose results eager/relaid_plan.py copies."""
    return None if registry.has_trait(func, "reads_row_major") else torch_orders(leaves, metas)


def _laid_out_in(tensor: torch.Tensor) -> tuple | None:
    """The order of dims a tensor's strides lay it out densely in, where not row-major."""
    order = memory_order(tuple(tensor.shape), tuple(tensor.stride()))
    return None if order is None else tuple(order)


def permute_sizes(sizes: tuple, order: tuple | None) -> tuple:
    """``sizes`` in ``order`` (as they are for None)."""
    return tuple(sizes) if order is None else tuple(sizes[d] for d in order)


def written_sizes(metas: list, out_orders: Orders | None) -> list:
    """Each result's sizes as its kernel writes it (in its order; None kept)."""
    return [None if m is None else permute_sizes(tuple(m.shape), None if out_orders is None else out_orders[i]) for i, m in enumerate(metas)]


def in_orders(keyed: list, traced: list, orders: Orders | None) -> tuple[list, list]:
    """A dynamic kernel's inputs (eager/dynamic.py: keys and traced sizes, in the tensors' own
    order of dims) as the kernel reads them: permuted into ``orders``."""
    if orders is None:
        return keyed, traced
    keyed = [k if o is None else (k[0], permute_sizes(k[1], o), k[2], "in order", o) for k, o in zip(keyed, orders)]
    traced = [t if o is None else (permute_sizes(t[0], o), t[1]) for t, o in zip(traced, orders)]
    return keyed, traced


def in_memory_order(traced: Callable, count: int, orders: Orders | None, out_orders: Orders | None) -> Callable:
    """``traced`` (a kernel's function: ``count`` tensors, then scalars) taking its tensor inputs
    as their buffers lie (permuted into ``orders``) and giving its results permuted into
    ``out_orders`` (one per result it returns)."""
    backs = [None if order is None else inverse(list(order)) for order in (orders or (None,) * count)]

    def ordered(*values: torch.Tensor) -> list[torch.Tensor]:
        values = [v if i >= count or backs[i] is None else v.permute(backs[i]) for i, v in enumerate(values)]
        outs = traced(*values)
        if out_orders is None:
            return outs
        return [o if order is None else o.permute(order) for o, order in zip(outs, out_orders)]

    return ordered
