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
