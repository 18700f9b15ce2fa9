"""The dtypes a turbine device holds, and their IREE element types."""

from __future__ import annotations

from typing import Any

import torch

from turbine.device import ELEMENT_TYPES as device_element_types
from turbine.errors import UnsupportedDtypeError, UnsupportedOpError

#: The dtypes IREE kernels take, with the element type a buffer view of each is made with.
ELEMENT_TYPES: dict[torch.dtype, Any] = {
    dtype: device_element_types[str(dtype).replace("torch.", "")]
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32,
                  torch.int64, torch.uint8, torch.bool)
}


#: dtypes a turbine tensor can hold although no IREE kernel takes them: their bytes live in device
#: buffers, and every op on them goes to the fallback policy (torch's kernel over the same memory
#: by default). Each maps to the real dtype of its parts, which is how they cross DLPack.
STORAGE_ONLY: dict[torch.dtype, torch.dtype] = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def check_dtype(dtype: torch.dtype, what: str = "a turbine tensor") -> torch.dtype:
    """Return dtype if a turbine device can hold it, else raise an error naming the way out."""
    if dtype not in ELEMENT_TYPES and dtype not in STORAGE_ONLY:
        supported = ", ".join(str(d).replace("torch.", "") for d in [*ELEMENT_TYPES, *STORAGE_ONLY])
        raise UnsupportedDtypeError(
            f"turbine does not support dtype {dtype} for {what}: turbine tensors hold {supported}. "
            "Keep such tensors on the CPU (.cpu()) or convert them first."
        )
    return dtype


def check_kernel_dtype(dtype: torch.dtype, what: str) -> torch.dtype:
    """Return dtype if IREE kernels take it; a storage-only dtype raises UnsupportedOpError (so the
    op goes to the fallback policy), any other unsupported dtype UnsupportedDtypeError."""
    if dtype in STORAGE_ONLY:
        raise UnsupportedOpError(f"IREE kernels do not take {dtype} ({what})")
    return check_dtype(dtype, what)
