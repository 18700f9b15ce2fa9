"""What a failed IREE call means for its device: out of memory, lost, or one failed call.

IREE reports a failure as a RuntimeError carrying its status text (``RESOURCE_EXHAUSTED; CUDA
error 'CUDA_ERROR_OUT_OF_MEMORY'``). Out of memory and most failures stay in the call that hit
them: the device runs later work as before. A kernel that faults on CUDA (an illegal address, a
device-side trap) poisons the whole CUDA context: every later call on it fails or waits forever.
Such a device is marked lost, and each later use raises :class:`DeviceLostError` at once, naming
the first failure, instead of failing every op with an unrelated message.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from turbine.errors import DeviceError, DeviceLostError, OutOfMemoryError

#: IREE's words for running out of device memory.
OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "CUDA_ERROR_OUT_OF_MEMORY", "hipErrorOutOfMemory", "VK_ERROR_OUT_OF_DEVICE_MEMORY")

#: CUDA and HIP errors after which the context cannot be used again ("sticky" errors).
CONTEXT_LOST = (
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "hipErrorIllegalAddress",
    "hipErrorLaunchFailure",
    "VK_ERROR_DEVICE_LOST",
    # torch's words for the same errors, when one of its kernels over the device memory (the
    # vendor executor, the device fallback) meets the lost context first
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: device-side assert triggered",
    "CUDA error: unspecified launch failure",
    "CUDA error: misaligned address",
    "CUDA error: an illegal instruction was encountered",
)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def context_lost(error: BaseException) -> bool:
    """Whether ``error`` (IREE's or torch's) says the GPU context it ran on cannot run work again."""
    words = _first_line(error)
    return any(mark in words for mark in CONTEXT_LOST)


#: Names of the devices this process lost.
_lost_devices: list[str] = []


def failure(device: Any, error: BaseException, doing: str) -> DeviceError:
    """The error to raise for IREE's ``error`` (or torch's, from its kernel over the device's
    memory) while ``device`` was ``doing`` something."""
    words = _first_line(error)
    if context_lost(error):
        if device.lost is None:
            device.lost = f"{doing}: {words}"
            _lost_devices.append(device.name)
        return lost(device)
    if any(mark in words for mark in OUT_OF_MEMORY):
        return OutOfMemoryError(
            f"{device.name} is out of memory {doing} ({words}). Free tensors you no longer need "
            "(del them) or work on smaller pieces."
        )
    return DeviceError(f"{device.name} failed {doing}: {words}")


def lost(device: Any) -> DeviceLostError:
    """The error for any use of a device marked lost."""
    return DeviceLostError(
        f"{device.name} is lost: a kernel faulted ({device.lost}), and its context cannot run work "
        "again. Nothing more can run or be read on it in this process: copy what you need from other "
        "devices and restart the process. To find the op that faulted, run with "
        "TURBINE_LAUNCH_BLOCKING=1 (each op then waits for its kernel)."
    )


def _exit_without_tearing_down() -> None:
    """Leave the process at once if a device was lost: releasing a lost CUDA context's objects
    at interpreter exit never returned (H200, IREE 3.13). Registered when turbine is imported,
    so it runs after turbine's other exit handlers; the exit status is 1, for the fault."""
    if _lost_devices:
        sys.stdout.flush()
        sys.stderr.write(f"turbine: {', '.join(_lost_devices)} was lost; exiting without releasing it (status 1)\n")
        sys.stderr.flush()
        os._exit(1)


atexit.register(_exit_without_tearing_down)
