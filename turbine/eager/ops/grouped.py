"""grouped_mm: a mixture-of-experts layer's matmul, each group of a jagged dim by its own matrix.

``torch._grouped_mm(a, b, offs)`` (``F.grouped_mm``; transformers' MoE experts call it: Mixtral,
Qwen3-MoE) cuts the jagged dim of its 2-d operand into groups, ``offs[g]`` ending group ``g``:

- ``a`` (M, K) by ``b`` (G, K, N): rows ``offs[g-1]:offs[g]`` of ``a`` times ``b[g]``, (M, N);
- ``a`` (G, M, K) by ``b`` (K, N): ``a[g]`` times columns ``offs[g-1]:offs[g]`` of ``b``, (M, N);
- ``a`` (M, K) by ``b`` (K, N): ``a``'s columns by ``b``'s rows of group ``g``, (G, M, N) (the
  weights' gradient);
- 3-d by 3-d, no ``offs``: a batched matmul.

IREE cannot compile it (its groups' sizes are data), and torch's shape rule describes only its
CUDA kernel (bfloat16), though torch's CPU kernel takes float32 and float16 too. So:

- Where torch's own kernel runs it (the vendor executor on a GPU, bfloat16): the offsets are
  checked on the device (torch's CUDA kernel asserts on one out of order or misaligned, which
  loses the CUDA context turbine shares with torch CUDA, and reads outside its operands past the
  end), then torch's kernel runs, timed against IREE's like any op.
- Everywhere else as torch's CPU kernel does it: the offsets read on the host (one wait, as
  torch's CPU kernel reads them), checked there, then one matmul per group that has elements,
  each an op of turbine's own (shape-generic: new group sizes compile nothing after the first
  change), joined into the result. What no group covers is zeros (torch's kernels leave it
  unwritten).

Autograd's formula for grouped_mm is grouped_mm in the other layouts, which come here as well.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from turbine.eager import executors
from turbine.eager.index_checks import checked
from turbine.eager.registry import Continue, declare
from turbine.eager.schema import as_call, bound_arguments
from turbine.eager.tensor import DeviceTensor

aten = torch.ops.aten

#: The dtypes torch's kernels multiply.
_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def _grouped_mm(func: Any, args: tuple, kwargs: dict) -> Any:
    """The handler: torch's kernel where the vendor runs it, else one matmul per group."""
    named = bound_arguments(func, args, kwargs)
    a, b, offs = named["self"], named["mat2"], named.get("offs")
    _check(a, b, offs, named.get("bias"), named.get("out_dtype"))
    if _torch_runs_it(a, b):
        return _checked_on_the_device(func, named)
    if offs is None:
        return torch.bmm(a, b)
    ends = offs.tolist()
    _check_ends(ends, *_jagged(a, b))
    starts = [0, *ends[:-1]]
    groups = [(g, start, end) for g, (start, end) in enumerate(zip(starts, ends)) if end > start]
    if a.dim() == 2 and b.dim() == 3:
        parts = [torch.mm(a[start:end], b[g]) for g, start, end in groups]
        return _joined(parts, 0, (a.shape[0], b.shape[2]), a)
    if a.dim() == 3:
        parts = [torch.mm(a[g], b[:, start:end]) for g, start, end in groups]
        return _joined(parts, 1, (a.shape[1], b.shape[1]), a)
    products = {g: torch.mm(a[:, start:end], b[start:end]) for g, start, end in groups}
    empty = a.new_zeros(a.shape[0], b.shape[1])
    return torch.stack([products.get(g, empty) for g in range(len(ends))]) if ends else a.new_zeros(0, *empty.shape)


def _check(a: DeviceTensor, b: DeviceTensor, offs: Any, bias: Any, out_dtype: torch.dtype | None) -> None:
    """torch's checks of a grouped_mm call (its CPU and CUDA kernels share them), in its order."""
    for name, matrix in (("mat_a", a), ("mat_b", b)):
        if matrix.dtype not in _DTYPES:
            raise RuntimeError(f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {matrix.dtype}")
    for name, matrix in (("mat_a", a), ("mat_b", b)):
        if matrix.dim() not in (2, 3):
            raise RuntimeError(f"{name} has to be 2 or 3d")
    if (a.dim() == 3 or b.dim() == 3) and a.shape[-1] != b.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    for matrix in (a, b):
        _check_strides(matrix)
    if (offs is not None) != (a.dim() == 2 or b.dim() == 2):
        raise RuntimeError("Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None and offs.dim() != 1:
        raise RuntimeError("offs has to be 1D")
    if offs is not None and offs.dtype != torch.int32:
        raise RuntimeError("Offsets have to be int32")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    if out_dtype is not None and out_dtype != a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    if a.dim() != b.dim():
        groups = a.shape[0] if a.dim() == 3 else b.shape[0]
        if offs.shape[0] != groups:
            raise RuntimeError("matrix batch sizes have to match")
    elif a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise RuntimeError("batched dimension has to match")


def _check_strides(matrix: DeviceTensor) -> None:
    """torch's kernels take a matrix (or a batch of them) stored by rows or by columns, the
    other stride a multiple of 16 bytes."""
    (rows, columns), (row_step, column_step) = matrix.shape[-2:], matrix.stride()[-2:]
    alignment = 16 // matrix.element_size()
    if row_step == 1 and column_step >= max(1, rows):
        other = column_step
    elif column_step == 1 and row_step >= max(1, columns):
        other = row_step
    else:
        raise RuntimeError(f"Invalid strides/sizes, got {list(matrix.stride())} for strides and {list(matrix.shape)} for sizes")
    if other % alignment:
        raise RuntimeError("strides should be multiple of 16 bytes")


def _torch_runs_it(a: DeviceTensor, b: DeviceTensor) -> bool:
    """Whether the vendor executor runs torch's grouped_mm kernel for this call: on a GPU (its
    CPU kernel is the same loop over groups as below), in bfloat16 (torch's shape rule)."""
    device = a._storage.device
    return device.kind == "cuda" and a.dtype == b.dtype == torch.bfloat16 and executors.VENDOR.runs_on(device)


def _jagged(a: DeviceTensor, b: DeviceTensor) -> tuple[str, int, int]:
    """The jagged dim's operand, its index there, and its length."""
    if a.dim() == 2:
        dim = 0 if b.dim() == 3 else 1
        return "mat_a", dim, a.shape[dim]
    return "mat_b", 1, b.shape[1]


def _check_ends(ends: list[int], operand: str, dim: int, length: int) -> None:
    """The groups' ends lie inside the jagged dim and do not decrease (torch's CPU kernel slices,
    so clamps, and checks nothing; its CUDA kernel asserts or reads outside)."""
    for position, end in enumerate(ends):
        if not 0 <= end <= length:
            raise _outside(operand, dim, length)(end, position)
        if position and end < ends[position - 1]:
            raise _decreasing(ends[position - 1] - end, position - 1)


def _outside(operand: str, dim: int, length: int) -> Callable[[int, int], RuntimeError]:
    """The error for an offset outside the jagged dim: (offset, its position) -> error."""
    where = f"each group ends inside {operand}'s dim {dim} (of length {length})"
    return lambda value, position: RuntimeError(f"grouped_mm: offs[{position}] is {value}, outside [0, {length}]: {where}")


def _decreasing(drop: int, position: int) -> RuntimeError:
    """The error for ``offs[position + 1]`` lying ``drop`` below ``offs[position]``."""
    return RuntimeError(f"grouped_mm: offs must not decrease, but offs[{position + 1}] is {drop} below offs[{position}]")


def _joined(parts: list, dim: int, shape: tuple[int, int], like: DeviceTensor) -> DeviceTensor:
    """The groups' products joined along ``dim``, zeros past the last group's end."""
    covered = sum(part.shape[dim] for part in parts)
    if covered < shape[dim]:
        rest = list(shape)
        rest[dim] = shape[dim] - covered
        parts = [*parts, like.new_zeros(rest)]
    if not parts:
        return like.new_zeros(shape)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _checked_on_the_device(func: Any, named: dict) -> Continue:
    """torch's kernel on offsets checked on the device: in ``[0, length]``, in order and (each
    group but the last) spanning a multiple of 16 bytes of every tensor it cuts (TMA's
    alignment). turbine reports the first bad entry at the next read, and the kernel gets
    offsets clamped into range, in order and aligned."""
    first, second, offs = named["self"], named["mat2"], named.get("offs")
    if not isinstance(offs, DeviceTensor) or offs.numel() == 0:
        return Continue(*as_call(func, named))
    operand, dim, length = _jagged(first, second)
    checked(offs, 0, length + 1, _outside(operand, dim, length))
    if offs.numel() > 1:
        steps = offs[1:].to(torch.int64) - offs[:-1].to(torch.int64)
        checked(steps, 0, 2**62, lambda step, position: _decreasing(-step, position))
    safe = torch.cummax(offs.clamp(0, length), 0).values
    align = _group_alignment(first, second, named.get("out_dtype"))
    if align > 1 and offs.numel() > 1:
        ends = offs[:-1]  # the last group may end anywhere
        words = lambda value, position: RuntimeError(  # noqa: E731
            f"grouped_mm: offs[{position}] is {value}, not a multiple of {align}: on a GPU each group but the last "
            f"spans a multiple of 16 bytes of the tensors it cuts (torch's CUDA kernel asserts otherwise)"
        )
        checked(torch.where(ends % align == 0, torch.zeros_like(ends), ends), 0, 1, words)
        safe = torch.cat([safe[:-1] // align * align, safe[-1:]])
    return Continue(*as_call(func, named | {"offs": safe}))


def _group_alignment(first: DeviceTensor, second: DeviceTensor, out_dtype: torch.dtype | None) -> int:
    """The elements a GPU grouped_mm's group must span a multiple of: 16 bytes of each tensor the
    jagged dim cuts, at that tensor's stride along it (the result's too, where it is cut)."""
    if first.dim() == 2 and second.dim() == 3:
        cut = [(first, 0)]
    elif first.dim() == 3:
        cut = [(second, 1)]
    else:
        cut = [(first, 1), (second, 0)]
    strides = [tensor.stride(dim) * tensor.element_size() for tensor, dim in cut]
    if first.dim() == 3 and second.dim() == 2:  # the result's columns: its contiguous dim
        strides.append((out_dtype or first.dtype).itemsize)
    return math.lcm(*(16 // math.gcd(16, stride) for stride in strides if stride))


declare(
    aten._grouped_mm.default,
    "one matmul per group on the offsets read on the host (as torch's CPU kernel reads them); torch's kernel "
    "on offsets checked on the device where the vendor runs it (a GPU, bfloat16)",
    handler=_grouped_mm,
)
