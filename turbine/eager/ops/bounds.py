"""Which ops take indices, what range each index must lie in, and torch's error when one does not.

Each op here checks its index tensors on the device before it runs (eager/index_checks.py): an
entry out of range is replaced by 0 for the op's kernel, and torch's error for the op is raised at
the next read from the device (or at the op, with ``TURBINE_CHECK_INDICES=eager``). In-place and
``out=`` forms run their out-of-place twin, which checks. Indexing (``x[i]``, ``index_put``)
checks in its own handler (eager/ops/indexing.py), through :func:`check_indexing`.

The list follows torch's GPU kernels as well as its CPU ones: a value one of them asserts on
(a class target, a probability, a count of mask entries) stops it with a device-side assert,
which loses the CUDA context turbine shares with torch CUDA, so each such value is checked here
before torch's kernel (the vendor executor, the ``device`` fallback) or IREE's sees it. Backward
ops are checked too: autograd hands them the forward's arguments as the caller gave them.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from turbine.eager.index_checks import Error, checked, checked_values
from turbine.eager.registry import Continue, declare
from turbine.eager.schema import as_call, bound_arguments, schema_of
from turbine.eager.tensor import DeviceTensor

aten = torch.ops.aten


def _out_of_bounds(kind: type, prefix: str = "") -> Callable[[int, int], Error]:
    """torch's words for an index out of a dim: (dim, size) -> the check's error."""
    return lambda dim, size: lambda value, position: kind(f"{prefix}index {value} is out of bounds for dimension {dim} with size {size}")


def _out_of_range_in_self(dim: int, size: int) -> Error:
    return lambda value, position: IndexError("index out of range in self")


#: Ops whose ``index`` (third argument) indexes ``dim`` (second) of the first argument:
#: op -> (negatives allowed, error maker).
_ALONG_A_DIM = {
    aten.gather.default: (False, _out_of_bounds(RuntimeError)),
    aten.scatter.src: (False, _out_of_bounds(RuntimeError)),
    aten.scatter.value: (False, _out_of_bounds(RuntimeError)),
    aten.scatter.reduce: (False, _out_of_bounds(RuntimeError)),
    aten.scatter.value_reduce: (False, _out_of_bounds(RuntimeError)),
    aten.scatter_add.default: (False, _out_of_bounds(RuntimeError)),
    aten.scatter_reduce.two: (False, _out_of_bounds(RuntimeError)),
    aten.index_select.default: (False, _out_of_range_in_self),
    aten.index_add.default: (False, _out_of_range_in_self),
    aten.index_reduce.default: (False, _out_of_range_in_self),
    aten.index_copy.default: (False, _out_of_bounds(IndexError, "index_copy_(): ")),
    aten.index_fill.int_Scalar: (True, _out_of_bounds(IndexError)),
    aten.index_fill.int_Tensor: (True, _out_of_bounds(IndexError)),
}


def _along_a_dim(func: Any, args: tuple, kwargs: dict) -> Continue:
    negatives, error = _ALONG_A_DIM[func]
    named = bound_arguments(func, args, kwargs)
    source, index = named["self"], named["index"]
    if not isinstance(index, DeviceTensor):
        return Continue(args, kwargs)
    dim = named["dim"] % max(source.dim(), 1)
    size = source.shape[dim] if source.dim() else 1
    return Continue(*as_call(func, named | {"index": checked(index, -size if negatives else 0, size, error(dim, size))}))


def _flat_index(func: Any, args: tuple, kwargs: dict) -> Continue:
    """``take`` and ``put``: indices into the tensor as if it were flat."""
    named = bound_arguments(func, args, kwargs)
    if not isinstance(named["index"], DeviceTensor):
        return Continue(args, kwargs)
    size = named["self"].numel()
    error = lambda value, position: IndexError(f"out of range: tried to access index {value} on a tensor of {size} elements.")  # noqa: E731
    return Continue(*as_call(func, named | {"index": checked(named["index"], -size, size, error)}))


def _embedding_rows(func: Any, args: tuple, kwargs: dict) -> Continue:
    """Indices lie in ``[0, rows)`` of the weight, and a bag's offset in ``[0, len(indices)]``:
    torch's GPU kernels assert on the first (which loses the CUDA context, shared with torch
    CUDA) or check nothing, its CPU embedding_bag backward wrote outside the weight's gradient (a
    crash), and both read past the indices on the second. Backward ops get the forward's indices
    as the caller gave them (autograd keeps them), so they are checked again; the forward's
    report, if any, comes first."""
    named, names = bound_arguments(func, args, kwargs), schema_of(func).names
    if "num_weights" in names:  # a gradient: the weight's rows, without the weight
        shape = [int(named["num_weights"])]
    else:
        shape = list(named["weight" if "weight" in names else "self"].shape)
    indices = named["indices"]
    if isinstance(indices, DeviceTensor):
        named["indices"] = checked(indices, 0, shape[0], _ROWS[func](shape))
    if isinstance(named.get("offsets"), DeviceTensor):
        named["offsets"] = _checked_offsets(named["offsets"], indices.numel())
    return Continue(*as_call(func, named))


def checked_bags(indices: DeviceTensor, offsets: DeviceTensor | None, weight: torch.Tensor) -> tuple[DeviceTensor, DeviceTensor | None]:
    """embedding_bag's indices checked against the weight's rows and its offsets against the
    indices' length, with torch's errors (eager/ops/bags.py, which runs ``F.embedding_bag``)."""
    shape = list(weight.shape)
    safe = checked(indices, 0, shape[0], _bag_index(shape))
    return safe, None if offsets is None else _checked_offsets(offsets, indices.numel())


def _checked_offsets(offsets: DeviceTensor, length: int) -> DeviceTensor:
    """A bag's offset lies in ``[0, length]`` (an empty last bag starts at the end)."""
    error = lambda value, position: RuntimeError(  # noqa: E731
        f"offsets[{position}] is {value}, outside [0, {length}]: each bag starts inside the input (of length {length})"
    )
    return checked(offsets, 0, length + 1, error)


def _bag_index(shape: list[int]) -> Error:
    """torch's words (its CPU kernel's) for a bag's index out of the weight's rows."""
    return lambda value, position: RuntimeError(f"Index {position} of input takes value {value} which is not in the valid range [0, {shape[0]})")


def _renormed_row(shape: list[int]) -> Error:
    """torch's words for a row ``max_norm`` renormalises outside the weight."""
    return lambda value, position: IndexError(f"select(): index {value} out of range for tensor of size {shape} at dimension 0")


#: Ops whose indices pick rows of an embedding weight (or of its gradient), with their offsets
#: into the indices where they have them: op -> torch's error, made from the weight's shape.
_ROWS: dict[Any, Callable[[list[int]], Error]] = {
    aten.embedding.default: lambda shape: _out_of_range_in_self(0, shape[0]),
    aten.embedding_dense_backward.default: lambda shape: _out_of_range_in_self(0, shape[0]),
    aten.embedding_backward.default: lambda shape: _out_of_range_in_self(0, shape[0]),
    aten.embedding_renorm.default: _renormed_row,
    aten._embedding_bag.default: _bag_index,
    aten._embedding_bag_forward_only.default: _bag_index,
    aten._embedding_bag_backward.default: _bag_index,
    aten._embedding_bag_dense_backward.default: _bag_index,
    aten._embedding_bag_per_sample_weights_backward.default: _bag_index,
}


def _nll_loss(func: Any, args: tuple, kwargs: dict) -> Continue:
    """Class targets lie in ``[0, classes)``, except those equal to ``ignore_index``."""
    named = bound_arguments(func, args, kwargs)
    scores, target = named["self"], named["target"]
    if not isinstance(target, DeviceTensor):
        return Continue(args, kwargs)
    classes = scores.shape[-1] if scores.dim() == 1 else scores.shape[1]
    error = lambda value, position: IndexError(f"Target {value} is out of bounds.")  # noqa: E731
    return Continue(*as_call(func, named | {"target": checked(target, 0, classes, error, ignore=int(named["ignore_index"]))}))


def _max_unpool(func: Any, args: tuple, kwargs: dict) -> Continue:
    """Pooling indices point into each output plane (``output_size`` elements)."""
    named = bound_arguments(func, args, kwargs)
    indices, output_size = named["indices"], [int(size) for size in named["output_size"]]
    if not isinstance(indices, DeviceTensor):
        return Continue(args, kwargs)
    plane = math.prod(output_size)
    sizes = "x".join(str(size) for size in output_size)
    error = lambda value, position: RuntimeError(f"Found an invalid max index: {value} (output volumes are of size {sizes})")  # noqa: E731
    return Continue(*as_call(func, named | {"indices": checked(indices, 0, plane, error)}))


def _pooling_indices(func: Any, args: tuple, kwargs: dict) -> Continue:
    """A pooling backward's indices point into each plane of its input (``self``). Autograd hands
    it the forward's indices, but a caller may pass any: torch's CPU and GPU kernels for max and
    adaptive pooling add gradients at them unchecked (a write outside the result, which crashed
    the process at exit on the CPU), its fractional pooling kernels assert on them."""
    named = bound_arguments(func, args, kwargs)
    if not isinstance(named["indices"], DeviceTensor):
        return Continue(args, kwargs)
    plane = list(named["self"].shape[-_POOLED_DIMS[func] :])
    sizes = "x".join(str(size) for size in plane)
    error = lambda value, position: RuntimeError(f"Found an invalid max index: {value} (input planes are of size {sizes})")  # noqa: E731
    return Continue(*as_call(func, named | {"indices": checked(named["indices"], 0, math.prod(plane), error)}))


#: Pooling backward ops, with the number of pooled (trailing) dims their indices count in.
_POOLED_DIMS = {
    aten.max_pool2d_with_indices_backward.default: 2,
    aten.max_pool3d_with_indices_backward.default: 3,
    aten.adaptive_max_pool2d_backward.default: 2,
    aten.adaptive_max_pool3d_backward.default: 3,
    aten.fractional_max_pool2d_backward.default: 2,
    aten.fractional_max_pool3d_backward.default: 3,
}


def _pivots(func: Any, args: tuple, kwargs: dict) -> Continue:
    """``lu_unpack``'s pivots are rows, counted from 1, of the factored matrix: torch's CPU kernel
    raises on one outside ``[1, m]``, IREE's kernel read outside its tensors. The check counts
    from 0, so that an entry it replaces becomes row 1."""
    named = bound_arguments(func, args, kwargs)
    factors, pivots, unpacking = named["LU_data"], named["LU_pivots"], named.get("unpack_pivots")
    if not isinstance(pivots, DeviceTensor) or unpacking is False or pivots.dtype not in (torch.int32, torch.int64):
        return Continue(args, kwargs)
    rows = factors.shape[-2]
    error = lambda value, position: RuntimeError(  # noqa: E731
        "pivots passed to lu_unpack must be between 1 and LU.size(-2) inclusive.Did you properly pass the result of lu_factor?"
    )
    safe = (checked(pivots.to(torch.int64) - 1, 0, rows, error) + 1).to(pivots.dtype)
    return Continue(*as_call(func, named | {"LU_pivots": safe}))


def _class_targets(func: Any, args: tuple, kwargs: dict) -> Continue:
    """Margin losses' class targets lie in ``[0, classes)`` (multi_margin) or ``[-1, classes)``
    (multilabel_margin, whose -1 ends a sample's targets). torch reads a multilabel sample's
    targets only up to its first -1, so it raises on fewer entries than this check does; the GPU
    kernels check nothing there and read outside the scores."""
    named = bound_arguments(func, args, kwargs)
    scores, target = named["self"], named["target"]
    if not isinstance(target, DeviceTensor):
        return Continue(args, kwargs)
    classes = scores.shape[-1] if scores.dim() else 1
    if func in _MULTILABEL:
        error = lambda value, position: RuntimeError("argument #2 'target' is out of range")  # noqa: E731
        safe = checked(target, 0, classes, error, ignore=-1)  # -1 ends the targets: kept as it is
    else:
        safe = checked(target, 0, classes, lambda value, position: RuntimeError("target out of range"))
    return Continue(*as_call(func, named | {"target": safe}))


_MULTILABEL = (aten.multilabel_margin_loss_forward.default, aten.multilabel_margin_loss_backward.default)


def _probabilities(func: Any, args: tuple, kwargs: dict) -> Continue:
    """binary_cross_entropy's input and target lie in ``[0, 1]``: torch's CPU kernel raises,
    its GPU kernel asserts (losing the CUDA context), IREE's kernel took logs of them anyway."""
    named = bound_arguments(func, args, kwargs)
    for name, words in (("self", "input"), ("target", "target")):
        if isinstance(named[name], DeviceTensor):
            error = lambda value, position, words=words: RuntimeError(f"all elements of {words} should be between 0 and 1")  # noqa: E731
            named[name] = checked_values(named[name], 0.0, 1.0, error)
    return Continue(*as_call(func, named))


def _masked_scatter(func: Any, args: tuple, kwargs: dict) -> Continue:
    """A mask with more ones than the source has elements: torch raises, and a kernel would read
    past the source. The ones past the source's count are dropped from the mask the kernel gets
    (the count itself is checked, so the error comes at the next read)."""
    named = bound_arguments(func, args, kwargs)
    target, mask, source = named["self"], named["mask"], named["source"]
    shape = torch.broadcast_shapes(target.shape, mask.shape)  # the result's: the two broadcast together
    if not isinstance(mask, DeviceTensor) or shape.numel() == 0:
        return Continue(args, kwargs)
    available = source.numel()
    flat = mask.expand(shape).reshape(-1)
    count = flat.to(torch.int64).cumsum(0)
    error = lambda value, position: RuntimeError("Number of elements of source < number of ones in mask")  # noqa: E731
    checked(count[-1:], 0, available + 1, error)
    return Continue(*as_call(func, named | {"mask": (flat & (count <= available)).reshape(shape)}))


def _repeat_counts(func: Any, args: tuple, kwargs: dict) -> Continue:
    """``repeat_interleave(repeats, output_size=n)``: the repeats must add up to ``n``, which torch's
    CPU kernel checks and its CUDA kernel does not (a larger sum writes past the result). A sum
    over ``n`` gives the kernel no repeats at all; any other sum is reported at the next read.
    Without ``n`` (no shape rule: the size is the data's), the repeats are checked and summed on
    the host, and the op runs with that ``n``."""
    named = bound_arguments(func, args, kwargs)
    repeats, size = named["repeats"], named.get("output_size")
    if not isinstance(repeats, DeviceTensor) or repeats.numel() == 0:
        return Continue(args, kwargs)
    if size is None:  # the result's size is the repeats' sum: read on the host, as torch CUDA reads it
        repeats = checked(repeats, 0, 1 << 62, lambda value, position: RuntimeError("repeats can not be negative"))
        return Continue(*as_call(func, named | {"repeats": repeats, "output_size": int(repeats.sum().item())}))
    total = repeats.sum().reshape(1).to(torch.int64)
    error = lambda value, position: RuntimeError("allocated size does not match required size")  # noqa: E731
    checked(total, size, size + 1, error)
    return Continue(*as_call(func, named | {"repeats": torch.where(total <= size, repeats, torch.zeros_like(repeats))}))


def check_indexing(source: DeviceTensor, indices: list) -> list:
    """``x[i, j]``'s index tensors, each checked against the dim it indexes (a boolean mask takes
    as many dims as it has, and is not checked: it cannot point outside)."""
    dim = 0
    result = []
    for index in indices:
        if isinstance(index, DeviceTensor) and index.dtype in (torch.int64, torch.int32):
            size = source.shape[dim]
            index = checked(index, -size, size, _out_of_bounds(IndexError)(dim, size))
        dim += index.dim() if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) else 1
        result.append(index)
    return result


def one_hot(tensor: DeviceTensor, num_classes: int = -1) -> torch.Tensor:
    """``F.one_hot`` with its classes checked: torch's composite form for a Python backend
    compares with an ``arange`` and checks nothing (it leaves that to a device-side assert)."""
    if num_classes == -1 and tensor.numel():
        num_classes = int(tensor.max().item()) + 1  # as torch does: a read
    if tensor.numel():  # torch looks for a negative class first, then for one too large
        tensor = checked(tensor, 0, 2**62, lambda value, position: RuntimeError("Class values must be non-negative."))
        tensor = checked(tensor, -(2**62), num_classes, lambda value, position: RuntimeError("Class values must be smaller than num_classes."))
    return torch.nn.functional.one_hot(tensor, num_classes)


def _divisor_checked(func: Any, args: tuple, kwargs: dict) -> Continue:
    """An integer division by 0 raises torch's CPU error ("ZeroDivisionError"): at once for a
    number, at the next read for a tensor's 0 (its kernel divides by 1 there: a division by 0
    trapped and killed the process). torch's CUDA kernels give garbage without an error."""
    named = bound_arguments(func, args, kwargs)
    x, other = named["self"], named["other"]
    if named.get("rounding_mode", "") is None:
        return Continue(args, kwargs)  # true division: floats
    dtype = torch.result_type(x, other)
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return Continue(args, kwargs)
    if isinstance(other, DeviceTensor):
        if other.numel():
            checked((other != 0).reshape(-1).to(torch.int64), 1, 2, lambda value, position: RuntimeError("ZeroDivisionError"))
    elif (other.item() if isinstance(other, torch.Tensor) else other) == 0 and x.numel():  # torch divides no element
        raise RuntimeError("ZeroDivisionError")
    return Continue(args, kwargs)


_DIVISIONS = [
    aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default, aten.floor_divide.Scalar,
    aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, aten.fmod.Tensor, aten.fmod.Scalar,
]


declare(list(_ALONG_A_DIM), "its index is checked against the size of the dim it indexes (eager/index_checks.py)", handler=_along_a_dim)
declare(_DIVISIONS, "an integer divisor's 0 raises torch's error (eager/index_checks.py reports it)", handler=_divisor_checked)
declare([aten.take.default, aten.put.default], "its indices are checked against the tensor's element count", handler=_flat_index)
declare([aten.max_unpool2d.default, aten.max_unpool3d.default], "its indices are checked against the output plane", handler=_max_unpool)
declare(
    list(_ROWS),
    "its indices are checked against the weight's rows, its offsets (if any) against the number of indices",
    handler=_embedding_rows,
)
declare(
    [aten.multi_margin_loss.default, aten.multi_margin_loss_backward.default, *_MULTILABEL],
    "its class targets are checked against the number of classes",
    handler=_class_targets,
)
declare(list(_POOLED_DIMS), "its indices are checked against its input's planes", handler=_pooling_indices)
declare(aten.lu_unpack.default, "its pivots are checked against the factored matrix's rows", handler=_pivots)
declare(aten.binary_cross_entropy.default, "its input and target are checked to lie in [0, 1]", handler=_probabilities)
declare(aten.masked_scatter.default, "its mask's ones are counted against the source's elements", handler=_masked_scatter)
declare(aten.repeat_interleave.Tensor, "its repeats are added up against the output_size it is given, or on the host into one", handler=_repeat_counts)
declare(
    [aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten.nll_loss2d_forward.default, aten.nll_loss2d_backward.default],
    "its class targets are checked against the number of classes (ignore_index aside)",
    handler=_nll_loss,
)
