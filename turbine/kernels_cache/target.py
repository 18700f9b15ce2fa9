"""What a kernel is compiled for: backend, architecture and flags, derived from a Device."""

from __future__ import annotations

import dataclasses
import functools

import iree.compiler.version

from turbine.config import config
from turbine.device import Device

_BACKENDS = {"cpu": "llvm-cpu", "cuda": "cuda", "hip": "rocm", "vulkan": "vulkan-spirv"}


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """The IREE compiler's version and source revision; part of every cache key, since a new
    compiler emits new code. Read from the compiler package itself (installs without package
    metadata, such as the GPU bundle, have it too). Imported with turbine, not at the first
    cache lookup: a warm process's first op paid 0.2 ms for it."""
    version = iree.compiler.version
    return f"{version.VERSION}+{version.REVISIONS.get('IREE', 'unknown')}"


@dataclasses.dataclass(frozen=True)
class Target:
    """Everything about the device that changes the compiled code."""

    backend: str
    arch: str
    flags: tuple[str, ...]

    def compile_flags(self) -> list[str]:
        common = [
            "--iree-input-type=torch",
            # Without this IREE silently computes float64 in float32 (seen on 3.13).
            "--iree-input-demote-f64-to-f32=false",
        ]
        if self.backend == "llvm-cpu":
            specific = [
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                f"--iree-llvmcpu-target-cpu={self.arch}",
            ]
        elif self.backend == "cuda":
            specific = ["--iree-hal-target-device=cuda", f"--iree-cuda-target={self.arch}"]
        elif self.backend == "rocm":
            specific = ["--iree-hal-target-device=hip", f"--iree-hip-target={self.arch}"]
        else:
            specific = ["--iree-hal-target-device=vulkan"]
        return common + specific + list(self.flags)

    def key(self) -> tuple:
        return (self.backend, self.arch, self.flags, compiler_version())


def target_for(device: Device) -> Target:
    """The compile target of a device: its options first, then ``turbine.config``."""
    default_arch = {
        "cpu": config.cpu_target,
        "cuda": config.cuda_target,
        "hip": config.hip_target,
        "vulkan": "",
    }[device.kind]
    flags = tuple(config.compiler_flags) + tuple(device.options.get("compiler_flags", ()))
    return Target(_BACKENDS[device.kind], device.options.get("target", default_arch), flags)
