"""Registering "turbine" as torch's PrivateUse1 backend, so torch.device("turbine", k) and autograd work."""

from __future__ import annotations

import torch

from turbine.device import registry
from turbine.eager import accelerator_fix, autocast, decompositions, device_module, pinning
from turbine.eager.ops import attention
from turbine.eager.tensor import rebuild

BACKEND = "turbine"


class _BackendModule:
    """What torch looks up as ``torch.turbine``: availability, the current device, waiting for a
    device, memory figures and seeds (eager/device_module.py), as ``torch.cuda`` has them."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        """A fixed ceiling, not the opened count: autograd sizes its per-device queues from this
        once, at the first backward, and a device opened later would fall outside them."""
        return registry.MAX_DEVICES

    @staticmethod
    def current_device() -> int:
        return registry.current().index

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """Random factories draw from torch's CPU generator, which torch.manual_seed already seeds."""

    set_device = staticmethod(device_module.set_device)
    Stream = device_module.Stream
    Event = device_module.Event
    stream = staticmethod(device_module.stream)
    current_stream = staticmethod(device_module.current_stream)
    default_stream = staticmethod(device_module.default_stream)
    synchronize = staticmethod(device_module.synchronize)
    memory_allocated = staticmethod(device_module.memory_allocated)
    max_memory_allocated = staticmethod(device_module.max_memory_allocated)
    reset_peak_memory_stats = staticmethod(device_module.reset_peak_memory_stats)
    memory_stats = staticmethod(device_module.memory_stats)
    empty_cache = staticmethod(device_module.empty_cache)
    manual_seed = staticmethod(device_module.manual_seed)
    seed = staticmethod(device_module.seed)
    seed_all = staticmethod(device_module.seed)
    initial_seed = staticmethod(device_module.initial_seed)

    @staticmethod
    def get_rng_state(device: object = None) -> torch.Tensor:
        """The state of the generator turbine's random ops draw from: torch's CPU generator.

        ``torch.random.fork_rng`` (used by checkpointing and by torch's own tests) saves and
        restores this around a block, as it does for CUDA.
        """
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: object = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]


def _no_tag(storage: object) -> None:
    """turbine tags no storage: its tensors have none (they pickle as host values, tensor.py)."""
    return None


def _host_storage_for_turbine(storage: object, location: str) -> object | None:
    """A storage ``torch.load`` maps to a turbine device stays on the host; None for others."""
    return storage if location.startswith(BACKEND) else None


def register() -> None:
    """Rename PrivateUse1 to "turbine" with a Python device guard and hooks (once per process).

    Without the guard and hooks, ``loss.backward()`` aborts the process ("PyTorch is not linked
    with support for turbine devices"). The Python guard knows a single current device, so
    autograd's per-device worker threads are turned off: backward then runs on the calling
    thread, which is correct for every turbine device (reported torch limitation).
    """
    if torch._C._get_privateuse1_backend_name() == BACKEND:
        return
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(BACKEND, _BackendModule())
    torch.autograd.set_multithreading_enabled(False)
    accelerator_fix.apply()  # naming PrivateUse1 broke torch's own CUDA autograd
    attention.register_autograd_kernel()  # torch's fused attention kernels where the vendor runs
    decompositions.register_shape_rules()  # Meta kernels torch lacks (the fused GRU cell, some gradients)
    autocast.register()  # torch.autocast("turbine"): torch has no autocast kernels for a Python backend
    pinning.apply()  # DataLoader(pin_memory=True) passes turbine-bound batches through unpinned
    # torch.load's default (weights_only) unpickles only allowed functions: turbine tensors in a
    # checkpoint are rebuilt from host values and a device name, nothing else.
    torch.serialization.add_safe_globals([rebuild])
    # map_location="turbine:..." is applied to every storage in the file, and turbine tensors'
    # values are saved as host storages: those stay on the host, and rebuild moves the tensor.
    torch.serialization.register_package(15, _no_tag, _host_storage_for_turbine)
