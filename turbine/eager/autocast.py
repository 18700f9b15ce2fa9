"""``torch.autocast("turbine", dtype=...)``: mixed precision with CUDA's casting rules.

torch keeps its autocast kernels in C++ per device type and has none for a Python backend (a
turbine matmul under autocast raised NotImplementedError for the ``Autocastturbine`` key). Here
the same rules are kernels of the ``AutocastPrivateUse1`` key, registered once: ops that run
well in low precision (matmuls, convolutions, linear, attention) take their floating inputs in
the autocast dtype; ops that need the range (exp, log, norms, softmax, losses, sums) take them
in float32; ops of several inputs that must agree (cat, stack, addcmul) take the widest. float64
is left as it is, as on CUDA. Every other op passes through. The lists follow torch's CUDA lists
(aten/src/ATen/autocast_mode.cpp); casts are ordinary ops, so backward runs through them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

_KEY = "AutocastPrivateUse1"
_EXCLUDED = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

#: Ops whose floating inputs are cast to the autocast dtype.
LOWER_PRECISION = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
)

#: Ops whose floating inputs are cast to float32.
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
    "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d", "prod", "softmax", "log_softmax",
    "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum",
)

#: Ops whose floating inputs are cast to the widest floating dtype among them.
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "scatter_add", "tensordot", "cat", "stack",
)

_libraries: list[torch.library.Library] = []


def _eligible(value: Any) -> bool:
    """A tensor autocast casts: floating, not float64, on a turbine device."""
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == "turbine"
    )


def _cast_to(dtype: torch.dtype, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    cast = lambda v: v.to(dtype) if _eligible(v) and v.dtype != dtype else v  # noqa: E731
    return tree_map(cast, args), tree_map(cast, kwargs)


def _widest(args: tuple, kwargs: dict) -> torch.dtype | None:
    dtypes = [v.dtype for v in tree_flatten((args, kwargs))[0] if _eligible(v)]
    if not dtypes:
        return None
    widest = dtypes[0]
    for dtype in dtypes[1:]:
        widest = torch.promote_types(widest, dtype)
    return widest


def _kernel(op: Any, policy: str) -> Callable:
    def autocast_kernel(*args: Any, **kwargs: Any) -> Any:
        if policy == "lower":
            dtype = torch.get_autocast_dtype("turbine")
        elif policy == "float32":
            dtype = torch.float32
        else:
            dtype = _widest(args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDED):
            if dtype is not None:
                args, kwargs = _cast_to(dtype, args, kwargs)
            return op(*args, **kwargs)

    return autocast_kernel


def _overloads(name: str) -> list[Any]:
    """The op's overloads that take tensors and are not ``out=`` forms."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    found = []
    for overload in packet.overloads():
        op = getattr(packet, overload)
        arguments = op._schema.arguments
        takes_tensors = any("Tensor" in str(a.type) for a in arguments)
        if takes_tensors and not any(a.is_out for a in arguments):
            found.append(op)
    return found


def register() -> None:
    """Register the autocast kernels and the pass-through for every other op (once)."""
    if _libraries:
        return
    library = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER_PRECISION, "lower"), (FLOAT32, "float32"), (PROMOTE, "promote")):
        for name in names:
            for op in _overloads(name):
                library.impl(op, _kernel(op, policy), _KEY)
    _libraries.append(library)  # registrations last as long as their library object
    every_op = torch.library.Library("_", "IMPL")
    try:
        every_op.fallback(torch.library.fallthrough_kernel, _KEY)
    except RuntimeError:  # a torch that passes other ops through itself already
        return
    _libraries.append(every_op)
