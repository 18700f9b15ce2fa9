"""Gradients traced from a forward's decomposition with ``torch.func.vjp``: grid sampling's, 2-D
and 3-D.

Where torch has a decomposition of an op's forward but none of its backward, and IREE lowers the
forward's pieces but not the backward op (``grid_sampler_2d_backward``), the backward is the
vector-Jacobian product of that decomposition: traced like any other function, it becomes the
backward ops of the forward's pieces (gathers' gradients as accumulating scatters, products',
selects'), which IREE compiles. It computes what torch's backward kernel computes, in the
forward's own arithmetic. The product is functionalized: autograd's formulas write in place
(clamp's gradient ANDs its masks in place), which IREE's importer refuses.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import torch
from torch._decomp import decomposition_table

from turbine.eager.decompositions._common import registers
from turbine.eager.decompositions.sampling import grid_sampler_3d

aten = torch.ops.aten


#: functorch's dispatch keys, which torch turns off inside a ``__torch_dispatch__`` call (where
#: make_fx runs decompositions): ``vjp`` needs them on.
_FUNCTORCH_KEYS = (
    torch._C.DispatchKey.Functionalize,
    torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode,
    torch._C.DispatchKey.FuncTorchDynamicLayerBackMode,
    torch._C.DispatchKey.FuncTorchGradWrapper,
)


@contextlib.contextmanager
def _functorch_on() -> Iterator[None]:
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for key in _FUNCTORCH_KEYS:
        excluded = excluded.remove(key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
        yield


def vjp(forward: Callable, primals: Sequence[torch.Tensor], cotangent: torch.Tensor) -> tuple:
    """The gradients of ``forward``'s result with respect to ``primals`` for ``cotangent``."""

    def gradients(cotangent: torch.Tensor, *primals: torch.Tensor) -> tuple:
        _, pullback = torch.func.vjp(forward, *primals)
        return pullback(cotangent)

    with _functorch_on():
        return torch.func.functionalize(gradients)(cotangent, *primals)


@registers(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """grid_sample's gradient (spatial transformers, optical flow warps): torch has none and IREE
    3.13 cannot lower it; the gradient of torch's decomposition of the forward."""
    forward = decomposition_table[aten.grid_sampler_2d.default]
    grad_input, grad_grid = vjp(lambda i, g: forward(i, g, interpolation_mode, padding_mode, align_corners), (input, grid), grad_output)
    return (grad_input if output_mask[0] else None), (grad_grid if output_mask[1] else None)


@registers(aten.grid_sampler_3d_backward.default)
def grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """3-D grid_sample's gradient (volumetric registration, video warps): the gradient of
    turbine's decomposition of the forward (decompositions/sampling.py). A grid of one point is
    taken as two, the second's gradient zero: IREE 3.13 never finished compiling the gradient
    for one point (over 10 minutes), and compiles two in seconds. float32 is differentiated in
    float64: the grid's gradient sums products over channels and corners that cancel, and in
    float32 it was farther from the exact value than torch's kernel (5e-5 against 4.7e-5)."""
    dtype = input.dtype
    if dtype == torch.float32:
        input, grid, grad_output = (t.to(torch.float64) for t in (input, grid, grad_output))
    single = grid.shape[1] * grid.shape[2] * grid.shape[3] == 1
    if single:
        grid = torch.cat([grid, grid], 3)
        grad_output = torch.cat([grad_output, torch.zeros_like(grad_output)], 4)
    grad_input, grad_grid = vjp(lambda i, g: grid_sampler_3d(i, g, interpolation_mode, padding_mode, align_corners), (input, grid), grad_output)
    if single:
        grad_grid = grad_grid.narrow(3, 0, 1)
    return (grad_input.to(dtype) if output_mask[0] else None), (grad_grid.to(dtype) if output_mask[1] else None)

