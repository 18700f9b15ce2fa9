"""Making a CUDA device's context current on the calling thread.

IREE's CUDA driver makes the device's (primary) context current on the thread that opens the
device, and sets it itself for most calls, but not for loading a module: a kernel loaded on
another thread (autograd's worker threads run backward ops; a user's threads) failed with
CUDA_ERROR_INVALID_CONTEXT. The context is read once where IREE left it current and made current
before each load, through the CUDA driver library IREE itself uses.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _library() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def current() -> int | None:
    """The calling thread's current CUDA context (a handle), or None where there is none."""
    handle = ctypes.c_void_p()
    if _library().cuCtxGetCurrent(ctypes.byref(handle)) != 0:
        return None
    return handle.value


def make_current(handle: int) -> None:
    """Make the context ``handle`` current on the calling thread."""
    status = _library().cuCtxSetCurrent(ctypes.c_void_p(handle))
    if status != 0:
        raise RuntimeError(f"cuCtxSetCurrent failed with CUDA error {status}")
