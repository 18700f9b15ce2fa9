"""Facts about ops' kernels that the generic way reads: precision, and when a compile cannot wait."""

from __future__ import annotations

import torch

from turbine.eager.registry import declare

aten = torch.ops.aten

declare(
    [aten.mm, aten.bmm, aten.mv, aten.dot, aten.vdot, aten.matmul, aten.convolution, aten.convolution_backward,
     aten._convolution],
    "a plain contraction: its speed on a GPU comes from half-precision math units (IREE's accumulate in float32 "
    "and round once, as torch's do); addmm and its kin are not, torch scales and adds in float32 before it rounds",
    traits=["native_precision"],
)
declare(
    [aten.convolution, aten.convolution_backward, aten.max_pool2d_with_indices, aten.max_pool2d_with_indices_backward,
     aten.max_pool3d_with_indices, aten.max_pool3d_with_indices_backward, aten.avg_pool2d, aten.avg_pool2d_backward,
     aten.avg_pool3d, aten.avg_pool3d_backward, aten._adaptive_avg_pool2d, aten._adaptive_avg_pool2d_backward,
     aten._adaptive_avg_pool3d, aten._adaptive_avg_pool3d_backward],
    "IREE 3.13 compiled it reading a channels-last image as it lies 4-10x slower than a gather and a row-major "
    "kernel (a 3x3 convolution of 8x32x32x32: 29 ms against 2.8 ms on a 2-core CPU; max_pool2d 2.6 against 0.6 ms)",
    traits=["reads_row_major"],
)
declare(
    [aten.nextafter, aten.frexp],
    "its result depends on the half-precision format itself",
    traits=["native_precision"],
)
declare(
    aten.multi_margin_loss.default,
    "torch's shape rule gives one sample's unreduced loss the shape [1], its kernel []; the lowering is refused "
    "(decompositions/margins.py) before the op hands out a tensor of the rule's shape",
    foreground=True,
)
declare(
    [aten._embedding_bag.default, aten._embedding_bag_forward_only.default],
    "torch's shape rule gives other shapes than its kernel (offset2bag in sum mode: [N] against [0]); the lowering "
    "is refused before the op hands out tensors of the rule's shapes (found by the OpInfo coverage run)",
    foreground=True,
)
