"""Linear algebra ops whose layout or error checks need more than a kernel."""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager import fallback
from turbine.eager.meta import meta_call, raise_as_torch_cpu
from turbine.eager.registry import Continue, declare
from turbine.eager.schema import bound_arguments, schema_of
from turbine.eager.views import to_host
from turbine.errors import UnsupportedOpError

aten = torch.ops.aten


def _factoring_the_transpose(func: Any, args: tuple, kwargs: dict) -> Any:
    """``_linalg_det`` and ``_linalg_slogdet`` return the LU factors of A^T for a contiguous A and
    of A otherwise, and their backward reads them that way; turbine's kernels factor A^T, so
    other layouts go to the fallback policy."""
    if args[0].is_contiguous():
        return Continue(args, kwargs)
    reason = UnsupportedOpError(f"{func} of a non-contiguous matrix factors A itself, which turbine's kernel does not")
    return fallback.run(func, args, kwargs, reason)


def _check_errors(func: Any, args: tuple, kwargs: dict) -> None:
    """linalg's error check (``info`` of a factorization): the host reads info, as torch's CUDA
    backend does, and torch's CPU op raises torch's own message for a nonzero one."""
    info, *rest = args
    func(to_host(info), *rest, **kwargs)


#: The dtypes torch's CPU factorizations take.
_LAPACK_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _cholesky(func: Any, args: tuple, kwargs: dict) -> Any:
    """The deprecated ``torch.cholesky`` as torch builds it: linalg's factorization (a kernel),
    then its error check in the words of ``cholesky``; the shape checks are its meta kernel's,
    and a matrix of no elements is returned as torch returns it, before any check of its shape.
    Other dtypes than LAPACK's raise torch's CPU error."""
    named = bound_arguments(func, args, kwargs)
    a, upper = named["self"], named.get("upper", False)
    if a.numel() == 0:
        return torch.empty_like(a)
    meta_call(func, schema_of(func), args, kwargs)
    if a.dtype not in _LAPACK_DTYPES:
        raise_as_torch_cpu(func, schema_of(func), args, kwargs)
    factor, info = aten.linalg_cholesky_ex.default(a, upper=upper)
    aten._linalg_check_errors.default(info, "cholesky", is_matrix=a.dim() == 2)
    return factor


declare(
    aten.cholesky.default,
    "linalg's factorization, then the host reads its info for torch's error in cholesky's words",
    handler=_cholesky,
)
declare(
    aten._linalg_check_errors.default,
    "the host reads a factorization's info, as torch's CUDA backend does, for torch's own error message",
    handler=_check_errors,
)
declare(
    [aten._linalg_det.default, aten._linalg_slogdet.default],
    "a contiguous matrix runs the kernel, which factors A^T as torch's returned factors expect",
    handler=_factoring_the_transpose,
)
declare(
    [aten._linalg_det.default, aten._linalg_slogdet.default],
    "a non-contiguous matrix: torch returns the factors of A itself, which turbine's kernel does not compute",
    fallback=True,
)
