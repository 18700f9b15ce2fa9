"""The dtypes a turbine device holds, and their IREE element types."""

from __future__ import annotations

import torch
import iree.runtime as rt

from turbine.errors import UnsupportedDtypeError

_ET = rt.HalElementType
ELEMENT_TYPES: dict[torch.dtype, int] = {
    torch.float32: _ET.FLOAT_32,
    torch.float16: _ET.FLOAT_16,
    torch.bfloat16: _ET.BFLOAT_16,
    torch.float64: _ET.FLOAT_64,
    torch.int8: _ET.SINT_8,
    torch.int16: _ET.SINT_16,
    torch.int32: _ET.SINT_32,
    torch.int64: _ET.SINT_64,
    torch.uint8: _ET.UINT_8,
    torch.bool: _ET.BOOL_8,
}


def check_dtype(dtype: torch.dtype, what: str = "a turbine tensor") -> torch.dtype:
    """Return dtype if a turbine device can hold it, else raise an error naming the way out."""
    if dtype not in ELEMENT_TYPES:
        supported = ", ".join(str(d).replace("torch.", "") for d in ELEMENT_TYPES)
        raise UnsupportedDtypeError(
            f"turbine does not support dtype {dtype} for {what}: IREE kernels take {supported}. "
            "Keep such tensors on the CPU (.cpu()) or convert them (e.g. torch.view_as_real for complex)."
        )
    return dtype
