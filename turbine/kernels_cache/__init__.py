"""Signature -> compiled kernel: targets, the compiler driver, the memory cache and its store hook."""

from turbine.kernels_cache.cache import LOWERING_VERSION, CompilingKernel, KernelCache, KernelStore, default_store, digest_of, kernel_cache
from turbine.kernels_cache.compiler import compile_mlir
from turbine.kernels_cache.kernel import Kernel
from turbine.kernels_cache.store import CacheWarning, DiskStore
from turbine.kernels_cache.target import Target, compiler_version, target_for

__all__ = [
    "CacheWarning",
    "CompilingKernel",
    "DiskStore",
    "LOWERING_VERSION",
    "default_store",
    "Kernel",
    "KernelCache",
    "KernelStore",
    "Target",
    "compile_mlir",
    "compiler_version",
    "digest_of",
    "kernel_cache",
    "target_for",
]
