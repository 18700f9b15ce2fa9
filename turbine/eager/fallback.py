"""Running an op no IREE kernel can run, under the fallback policy (``TURBINE_FALLBACK``).

- ``device`` (default): torch's own kernel runs over the same device memory, shared through
  DLPack without a copy: torch's CPU kernels for ``turbine:cpu*``, torch's CUDA kernels for
  ``turbine:cuda*`` where torch has CUDA. Results are imported back the same way. Devices torch
  cannot run on (hip without a ROCm torch, vulkan) take the ``host`` path instead.
- ``host``: copy the inputs to the CPU, run torch's CPU kernel, copy the results back (counted
  as host transfers).
- ``error``: raise an error naming the op, why IREE could not run it, and how to change policy.

Each fallback is counted per op (``turbine.stats()["fallbacks"]``) and warned once per op with
:class:`TurbineFallbackWarning`. Written arguments are updated by writing new buffers into their
storages, so buffers stay immutable and views see the change.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import torch

from turbine.config import config
from turbine.counters import counters
from turbine.device import Device, export_capsule, import_capsule
from turbine.eager import host
from turbine.eager.dtypes import ELEMENT_TYPES, STORAGE_ONLY
from turbine.eager.tensor import DeviceTensor, Storage
from turbine.eager.transfer import to_device
from turbine.errors import UnsupportedOpError

POLICIES = ("device", "host", "error")


class TurbineFallbackWarning(UserWarning):
    """An op ran with torch's kernel rather than a compiled IREE kernel (warned once per op)."""


_warned: set[str] = set()


@contextlib.contextmanager
def fallback(policy: str) -> Iterator[None]:
    """``with turbine.fallback("host"):`` sets the fallback policy for a block."""
    _check(policy)
    old = config.fallback
    config.fallback = policy
    try:
        yield
    finally:
        config.fallback = old


def _check(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown turbine fallback policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return policy


def run(func: Any, args: tuple, kwargs: dict, reason: Exception) -> Any:
    """Run ``func`` by the current policy, after IREE could not (``reason`` says why)."""
    policy = _check(config.fallback)
    why = str(reason).strip().splitlines()[0].rstrip(":") if str(reason).strip() else type(reason).__name__
    if policy == "error":
        raise UnsupportedOpError(
            f"{func} cannot run as an IREE kernel ({why}) and the fallback policy is 'error'. Set "
            "TURBINE_FALLBACK=device (torch's kernel on the device memory) or host, or use "
            "`with turbine.fallback('device'):`."
        ) from reason
    device = host.device_of(args, kwargs)
    if policy == "device" and not _torch_runs_on(device):
        policy = "host"
    name = str(func)
    counters.fallbacks[name] += 1
    if name not in _warned:
        _warned.add(name)
        where = "torch's kernel over the device memory" if policy == "device" else "torch's CPU kernel on host copies"
        warnings.warn(
            f"turbine: {name} runs with {where} (fallback policy '{policy}'): {why}", TurbineFallbackWarning, stacklevel=3
        )
    try:
        if policy == "host":
            return host.run_on_host(func, args, kwargs, device)
        return _run_on_device_memory(func, args, kwargs, device)
    except Exception as error:
        raise UnsupportedOpError(
            f"{func} could not run on {device.name if device else 'turbine'}: IREE could not run it ({why}), and "
            f"neither could torch's kernel under the '{policy}' fallback ({str(error).splitlines()[0] if str(error) else type(error).__name__})."
        ) from error


def _torch_runs_on(device: Device | None) -> bool:
    if device is None or device.kind == "cpu":
        return True
    return device.kind == "cuda" and torch.cuda.is_available()


def _torch_tensor(tensor: DeviceTensor) -> torch.Tensor:
    """A torch tensor (CPU or CUDA) over the same memory as ``tensor``, after its producer finished."""
    storage = tensor._storage
    parts = STORAGE_ONLY.get(storage.dtype)  # complex storage crosses DLPack as its real parts
    count = storage.numel * (2 if parts else 1)
    shared = torch.from_dlpack(export_capsule(storage.buffer, count, ELEMENT_TYPES[parts or storage.dtype]))
    if parts:
        shared = torch.view_as_complex(shared.view(-1, 2))
    return shared.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def _import(result: torch.Tensor, device: Device) -> DeviceTensor:
    """A torch result as a DeviceTensor: shared through DLPack when IREE accepts it, else uploaded."""
    if result.device.type == "cuda":
        torch.cuda.current_stream(result.device).synchronize()  # IREE reads it on its own streams
    dense = result.resolve_conj().resolve_neg().contiguous()  # torch's lazy conj/neg bits, made real
    parts = dense.dtype in STORAGE_ONLY
    try:
        buffer, view = import_capsule(device, torch.utils.dlpack.to_dlpack(torch.view_as_real(dense) if parts else dense))
    except Exception:  # misaligned or an odd layout: copy it (a counted transfer)
        return to_device(dense.cpu(), device)
    tensor = DeviceTensor(Storage(device, dense.dtype, dense.numel(), buffer), tuple(dense.shape))
    if not parts:
        tensor._view_cache = (buffer, view)
    return tensor


def _run_on_device_memory(func: Any, args: tuple, kwargs: dict, device: Device) -> Any:
    """torch's kernel over shared memory; an argument the op writes is first cloned by torch (on
    the device) and the clone written back, so no buffer turbine handed out changes under it."""

    def shared(tensor: DeviceTensor, written: bool) -> torch.Tensor:
        result = _torch_tensor(tensor)
        return result.clone() if written else result

    torch_device = torch.device("cuda", device.spec.ordinal) if device.kind == "cuda" else torch.device("cpu")
    return host.run_with_torch(func, args, kwargs, shared, lambda result: _import(result, device), torch_device)
