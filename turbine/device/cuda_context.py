"""Making a CUDA device's context current on the calling thread.

IREE's CUDA driver makes the device's (primary) context current on the thread that opens the
device, and sets it itself for queue work, but not when it allocates or loads a module: on
another thread (autograd's worker threads run backward ops; a user's threads) both failed with
CUDA_ERROR_INVALID_CONTEXT. The context is read once where IREE left it current and made current
at each use of the device (Device.require_usable), through the CUDA driver library IREE uses.
Setting it costs well under a microsecond.
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
