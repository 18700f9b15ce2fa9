"""One configuration object for turbine, read from ``TURBINE_*`` environment variables.

Every knob lives here so that a user finds them in one place (the README lists them) and
tests can change them with :func:`override` without touching the environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Callable, Iterator, Sequence

import platformdirs


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def _env_int(name: str, default: int, unit: str) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of {unit}, not {value!r}") from None


def default_cpu_workers() -> int:
    """One IREE worker per core the process may use, less one for the Python thread issuing ops.

    On a 2-core machine IREE's own default (a worker per core) leaves the issuing thread fighting
    two workers: a chain of small ops then costs 2x, in context switches. Large ops lose some
    parallelism instead, which matters less as cores grow.
    """
    return max(1, len(os.sched_getaffinity(0)) - 1)


@dataclasses.dataclass
class Config:
    """Process-wide settings. Change fields directly or through :func:`override`."""

    #: The device plain ``"turbine"`` means when no ``with turbine.device(...)`` is active.
    default_device: str = "cpu"
    #: Extra flags handed to the IREE compiler for every kernel (space separated in the env var).
    compiler_flags: tuple[str, ...] = ()
    #: Target CPU for llvm-cpu kernels; "host" tunes for this machine.
    cpu_target: str = "host"
    #: GPU architecture for cuda kernels (IREE 3.13 accepts sm_80 and runs it on Hopper).
    cuda_target: str = "sm_80"
    #: GPU architecture for hip kernels.
    hip_target: str = "gfx942"
    #: Largest number of scalar constants (0-d device buffers) kept per device for reuse.
    scalar_cache_size: int = 256
    #: Keep compiled kernels on disk between processes.
    cache_enabled: bool = True
    #: Where the disk cache lives (default: the user cache dir, e.g. ~/.cache/turbine).
    cache_dir: str = ""
    #: Size limit of the disk cache; least recently used kernels go first.
    cache_max_bytes: int = 2 * 1024**3
    #: Compile the kernels a process used into one module when it exits, so that the next
    #: process loads them at once (kernels_cache/bundles.py).
    cache_bundles: bool = True
    #: The fewest kernels, used and in no bundle yet, that make a process build a bundle.
    bundle_min_kernels: int = 8
    #: Keep the plans a process built on disk for the next process (eager/saved_plans.py).
    cache_plans: bool = True
    #: Show a progress bar (terminal, notebook) or log lines while kernels compile.
    progress: bool = True
    #: What runs an op no IREE kernel can run: "device", "host" or "error" (eager/fallback.py).
    fallback: str = "device"
    #: Worker threads of ``turbine:cpu`` devices (0: IREE's default, one per core). Read once,
    #: when the first CPU device opens.
    cpu_workers: int = dataclasses.field(default_factory=default_cpu_workers)
    #: How long an idle ``turbine:cpu`` worker spins before it sleeps, in microseconds. A chain of
    #: small ops leaves the worker idle between them; asleep, it must be woken by a system call for
    #: each op, which doubles the per-op cost on a loaded 2-core machine (benchmarks/dispatch.py).
    #: The host asks a fence this long before it blocks on it too (device.py).
    cpu_spin_us: int = 100
    #: IREE runtime flags (``--task_worker_spin_us=50``, say), applied once before any device opens.
    runtime_flags: tuple[str, ...] = ()
    #: Let ops whose kernel is compiling return at once, so that the next ops' kernels compile at
    #: the same time (eager/deferred.py); off, each op waits for its own compile.
    background_compile: bool = True
    #: Compiler processes that may compile kernels at the same time (read at the first compile).
    compile_jobs: int = dataclasses.field(default_factory=lambda: len(os.sched_getaffinity(0)))
    #: Seconds one kernel's compile may take before its compiler process is stopped and the op
    #: runs by the fallback policy (0: no limit). The slowest compiles seen take under 90 s.
    compile_timeout: float = 300.0
    #: Keep torch's own CUDA autograd working beside turbine (eager/accelerator_fix.py). Read
    #: once, at import.
    fix_cuda_autograd: bool = True
    #: Wait for each kernel as it is launched, so that a kernel that faults is reported by its own
    #: op (like CUDA_LAUNCH_BLOCKING); slow, for finding such an op.
    launch_blocking: bool = False
    #: Which executors may run ops IREE can run too (eager/executors/vendor.py): "auto" (IREE's
    #: kernels, and on GPUs torch's own kernels (cuBLAS, cuDNN, its elementwise kernels) where
    #: timing both shows them faster), "iree" (IREE's kernels alone; torch's only as the
    #: fallback policy's) or "all" (the vendor executor on every device torch runs, CPU too).
    executors: str = "auto"
    #: Which dims of a kernel take any size (eager/dynamic.py): "auto" (a dim that takes a second
    #: size of 2 or more, from then on), "off" (a kernel per size) or "all" (every dim of size 2
    #: or more, from the first call).
    dynamic: str = "auto"
    #: When an out-of-range index raises torch's error (eager/index_checks.py): "lazy" (at the
    #: next read from the device, as CUDA reports device-side asserts) or "eager" (at the op,
    #: which then waits for its check).
    check_indices: str = "lazy"

    def __setattr__(self, name: str, value: object) -> None:
        """Set a field; the listeners of that field (:func:`on_change`) hear of a new value."""
        changed = name in self.__dict__ and self.__dict__[name] != value
        super().__setattr__(name, value)
        if changed:
            for listener in _listeners.get(name, ()):
                listener()

    @classmethod
    def from_env(cls) -> "Config":
        return cls(
            default_device=os.environ.get("TURBINE_DEFAULT_DEVICE", "cpu") or "cpu",
            compiler_flags=tuple(os.environ.get("TURBINE_COMPILER_FLAGS", "").split()),
            cpu_target=os.environ.get("TURBINE_CPU_TARGET", "host") or "host",
            cuda_target=os.environ.get("TURBINE_CUDA_TARGET", "sm_80") or "sm_80",
            hip_target=os.environ.get("TURBINE_HIP_TARGET", "gfx942") or "gfx942",
            cache_enabled=_env_bool("TURBINE_CACHE", True),
            cache_dir=os.environ.get("TURBINE_CACHE_DIR", "") or platformdirs.user_cache_dir("turbine"),
            cache_max_bytes=_env_int("TURBINE_CACHE_MAX_BYTES", 2 * 1024**3, "bytes"),
            cache_bundles=_env_bool("TURBINE_CACHE_BUNDLES", True),
            bundle_min_kernels=_env_int("TURBINE_BUNDLE_MIN_KERNELS", 8, "kernels"),
            cache_plans=_env_bool("TURBINE_CACHE_PLANS", True),
            progress=_env_bool("TURBINE_PROGRESS", True),
            fallback=os.environ.get("TURBINE_FALLBACK", "device") or "device",
            cpu_workers=_env_int("TURBINE_CPU_WORKERS", default_cpu_workers(), "worker threads"),
            cpu_spin_us=_env_int("TURBINE_CPU_SPIN_US", 100, "microseconds"),
            runtime_flags=tuple(os.environ.get("TURBINE_RUNTIME_FLAGS", "").split()),
            background_compile=_env_bool("TURBINE_BACKGROUND_COMPILE", True),
            compile_jobs=_env_int("TURBINE_COMPILE_JOBS", len(os.sched_getaffinity(0)), "processes"),
            compile_timeout=_env_int("TURBINE_COMPILE_TIMEOUT", 300, "seconds"),
            fix_cuda_autograd=_env_bool("TURBINE_FIX_CUDA_AUTOGRAD", True),
            launch_blocking=_env_bool("TURBINE_LAUNCH_BLOCKING", False),
            executors=os.environ.get("TURBINE_EXECUTORS", "auto").strip() or "auto",
            dynamic=os.environ.get("TURBINE_DYNAMIC", "auto").strip() or "auto",
            check_indices=os.environ.get("TURBINE_CHECK_INDICES", "lazy").strip() or "lazy",
        )


#: Field name -> what to call when it takes a new value (:func:`on_change`).
_listeners: dict[str, list[Callable[[], None]]] = {}

config = Config.from_env()


def on_change(name: str, listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever :data:`config`'s ``name`` takes a new value: for what was
    decided under the old value and kept (the plans chosen under ``executors``)."""
    _listeners.setdefault(name, []).append(listener)


def choice(name: str, choices: Sequence[str]) -> str:
    """The setting ``name`` of :data:`config`, which must be one of ``choices``; an error names
    its environment variable and the values it takes."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"TURBINE_{name.upper()} (turbine.config.{name}) is {value!r}; choose one of {', '.join(choices)}")
    return value


@contextlib.contextmanager
def override(**changes: object) -> Iterator[Config]:
    """Temporarily change fields of :data:`config` (restored on exit, even on error)."""
    old = {name: getattr(config, name) for name in changes}
    for name, value in changes.items():
        if not hasattr(config, name):
            raise AttributeError(f"turbine.config has no setting {name!r}")
        setattr(config, name, value)
    try:
        yield config
    finally:
        for name, value in old.items():
            setattr(config, name, value)
