"""Signature -> loaded kernel: memory first, then a pluggable on-disk store, then the compiler.

A signature is a tuple of plain values (strings, numbers, tuples) built by the eager layer; this
module adds the target and compiler version and never looks inside it. Failed compiles are kept
too (a negative cache), so a signature IREE cannot compile costs one compile, not one per call.
"""

from __future__ import annotations

import atexit
import copy
import functools
import hashlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Callable, Protocol, Sequence

from turbine.config import config
from turbine.counters import counters
from turbine.device import Device
from turbine.errors import CompileError, CompilerCrash, CompileTimeout
from turbine.kernels_cache import bundles
from turbine.kernels_cache.compiler import compile_mlir
from turbine.kernels_cache.kernel import Kernel, LoadedModule
from turbine.kernels_cache.progress import BURST_GAP, progress
from turbine.kernels_cache.store import DiskStore
from turbine.kernels_cache.target import Target, target_for

log = logging.getLogger("turbine")

#: Bump by hand whenever the eager layer changes how it lowers ops: old cache entries then miss.
LOWERING_VERSION = 15


class KernelStore(Protocol):
    """Where compiled modules outlive the process (the disk layer plugs in here).

    A record is a dict of plain values: what the cache says of a module (its op, target, the
    caller's ``metadata``, which inputs it hands back: ``tied``); ``save`` returns it as stored.
    """

    def load(self, digest: str) -> tuple[bytes | memoryview, dict] | None: ...

    def save(self, digest: str, module: bytes | memoryview, record: dict) -> dict: ...

    def load_failure(self, digest: str) -> str | None: ...

    def save_failure(self, digest: str, message: str, record: dict) -> None: ...

    def load_choice(self, digest: str) -> dict | None: ...

    def save_choice(self, digest: str, choice: dict) -> None: ...

    def save_source(self, digest: str, text: str) -> None: ...

    def load_bundle(self, digest: str) -> tuple[bytes | memoryview, dict] | None: ...


class Bundle:
    """A bundle's module (bundles.py), loaded at most once per device for all its members."""

    def __init__(self, module: bytes | memoryview) -> None:
        self.module = module
        self._loaded: dict[int, LoadedModule] = {}

    def on(self, device: Device) -> LoadedModule:
        loaded = self._loaded.get(device.index)
        if loaded is None:
            loaded = self._loaded.setdefault(device.index, LoadedModule(device, self.module))
        return loaded


class CompilingKernel:
    """A kernel whose module a compile thread is making (``KernelCache.start``).

    ``result()`` loads the module on the calling thread: a CUDA context is current on the
    thread that made it, and loading a module on a compile thread failed there.
    """

    def __init__(self, cache: "KernelCache", key: tuple, device: Device, future: Future) -> None:
        self._cache = cache
        self._key = key
        self._device = device
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> Kernel:
        """The loaded kernel, once compiled (waits); raises the compile's CompileError."""
        entry = self._future.result()
        return self._cache._install(self._key, self._device, entry)


def digest_of(key: tuple) -> str:
    """A stable hex digest of a full cache key (its repr holds only plain values)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()


class KernelCache:
    """The process's kernels, shared by every tensor whose op has the same signature and target."""

    def __init__(self, store: KernelStore | None = None) -> None:
        self.store = store
        self._lock = threading.Lock()
        #: key -> (module, record); a bundle member's module is its Bundle, its record names its function
        self._entries: dict[tuple, tuple[bytes | memoryview | Bundle, dict]] = {}
        #: digest -> (Bundle, record) of members of loaded bundles not asked for yet
        self._members: dict[str, tuple[Bundle, dict]] = {}
        #: keys of kernels this process loaded that could join a bundle and are in none, in order of first use
        self._unbundled: dict[tuple, None] = {}
        self._loaded: dict[tuple, Kernel] = {}
        self._failed: dict[tuple, CompileError] = {}
        self._choices: dict[tuple, dict | None] = {}  # keep_choice's, and None for keys looked up in vain
        self._compiling: dict[tuple, threading.Event] = {}  # keys a thread is compiling now
        self._compilers: ThreadPoolExecutor | None = None  # threads of ``start``, made at first need
        self._started: set[Future] = set()  # compiles ``start`` handed to those threads, until done

    def clear_memory(self) -> None:
        """Forget every kernel and failure held in memory (the store is left alone)."""
        with self._lock:
            self._entries.clear()
            self._members.clear()
            self._unbundled.clear()
            self._loaded.clear()
            self._failed.clear()
            self._choices.clear()

    def kernel(
        self,
        signature: tuple,
        device: Device,
        lower: Callable[[], str] | Sequence[Callable[[], str]],
        describe: str,
        metadata: dict | None = None,
    ) -> Kernel:
        """The loaded kernel for a signature on a device, compiling it only when new.

        ``lower`` gives the MLIR text; a sequence of them are alternatives tried in order until one
        compiles (an op as it is, then decomposed), and the first that compiles is what the
        signature's entry holds. ``describe`` names the op for messages. ``metadata`` (plain
        values) is kept with a new entry and comes back as ``kernel.metadata`` in later processes.
        Raises CompileError, the same one every later time, when the compiler rejects every
        alternative. Threads asking for different new signatures compile them at the same time;
        threads asking for the same one share its compile.
        """
        target, key, kernel = self._lookup(signature, device)
        if kernel is not None:
            return kernel
        entry = self._found_or_compiled(key, target, lower, describe, metadata or {})
        return self._install(key, device, entry)

    def start(
        self,
        signature: tuple,
        device: Device,
        lower: Callable[[], str] | Sequence[Callable[[], str]],
        describe: str,
        metadata: dict | None = None,
    ) -> Kernel | CompilingKernel:
        """``kernel`` without waiting for the compiler: a cached kernel at once, else a
        CompilingKernel whose compile runs on one of ``config.compile_jobs`` threads, so an eager
        program can go on issuing ops while new kernels compile side by side. The first lowering
        is traced here, in the calling thread (``_first_lowered_here``).
        """
        target, key, kernel = self._lookup(signature, device)
        if kernel is not None:
            return kernel
        with self._lock:
            entry = self._entry(key, describe)
            if entry is None and self._compilers is None:
                self._compilers = ThreadPoolExecutor(max(1, config.compile_jobs), thread_name_prefix="turbine-compile")
        if entry is not None:
            return self._install(key, device, entry)
        lowerings = _first_lowered_here(lower)
        future = self._compilers.submit(self._found_or_compiled, key, target, lowerings, describe, metadata or {})
        with self._lock:
            self._started.add(future)
        future.add_done_callback(self._finished)
        return CompilingKernel(self, key, device, future)

    def _finished(self, future: Future) -> None:
        with self._lock:
            self._started.discard(future)

    def wait_for_compiles(self, timeout: float | None = None) -> bool:
        """Wait until the compiles started in the background have finished; False if ``timeout``
        seconds passed first. An op that ran on another executor meanwhile (the vendor's, while
        IREE's kernel compiled) leaves its compile running after the op: tests wait here so that
        it does not count in the next test's stats."""
        with self._lock:
            started = list(self._started)
        return not futures_wait(started, timeout).not_done

    def _found_or_compiled(
        self, key: tuple, target: Target, lower: Callable[[], str] | Sequence[Callable[[], str]], describe: str, metadata: dict
    ) -> tuple[bytes, dict]:
        """A key's module and record from memory or the store, else compiled here. Threads
        asking for different new keys compile them at the same time; threads asking for the same
        one share its compile."""
        while True:
            with self._lock:
                entry = self._entry(key, describe)
                if entry is not None:
                    return entry
                compiling = self._compiling.get(key)
                if compiling is None:
                    compiling = self._compiling[key] = threading.Event()
                    break
            compiling.wait()  # another thread compiles this key; then look again
        try:
            entry = self._compile(key, target, lower, describe, metadata)
            with self._lock:
                self._entries[key] = entry
            return entry
        finally:
            with self._lock:
                del self._compiling[key]
            compiling.set()

    def stored(self, signature: tuple, device: Device, digest: str | None = None) -> Kernel | None:
        """The kernel for a signature if memory or the store has it; never compiles, and
        never looks for a failure (the caller's full path, ``kernel`` or ``start``, does).

        The eager layer asks this first so that a warm process can build a plan from the
        kernel's metadata alone, without tracing or checking the op again. ``digest`` is the
        key's as ``digest()`` gave it for this device's current target, when the caller kept it
        (saved plans do): it saves hashing the key again, 10-15 us in a new process's first lookups.
        """
        _, key, kernel = self._lookup(signature, device)
        if kernel is not None:
            return kernel
        with self._lock:
            if key in self._failed:
                return None
            entry = self._entries.get(key)
            if entry is not None:
                counters.cache_hits_memory += 1
            else:
                entry = self._load_entry(key, digest)
        return None if entry is None else self._install(key, device, entry)

    def digest(self, signature: tuple, device: Device) -> str:
        """The digest that names a signature's entry for a device (its target's at this moment)."""
        return digest_of(self._lookup(signature, device)[1])

    def _entry(self, key: tuple, describe: str) -> tuple[bytes | memoryview | Bundle, dict] | None:
        """The module and record of a key from memory or the store, or None; raises a known
        failure. Called with the lock held."""
        if key in self._failed:
            raise copy.copy(self._failed[key])  # the kept error gathers no traceback
        entry = self._entries.get(key)
        if entry is not None:
            counters.cache_hits_memory += 1
            return entry
        entry = self._load_entry(key)
        if entry is None:
            self._raise_stored_failure(key, describe)
        return entry

    def _lookup(self, signature: tuple, device: Device) -> tuple[Target, tuple, Kernel | None]:
        """A signature's target and full key on a device, and its kernel if already loaded there."""
        target = target_for(device)
        key = (signature, target.key(), LOWERING_VERSION)
        return target, key, self._memory_hit(key, device)

    def _memory_hit(self, key: tuple, device: Device) -> Kernel | None:
        kernel = self._loaded.get((key, device.index))
        if kernel is not None:
            counters.cache_hits_memory += 1
            if progress.bar is not None and time.monotonic() - progress.last > BURST_GAP:
                progress.close()
        return kernel

    def _install(self, key: tuple, device: Device, entry: tuple[bytes, dict]) -> Kernel:
        """The kernel of an entry loaded on a device (once: threads may race to it).

        The module loads outside the lock (60-120 us), so compile threads finishing meanwhile
        do not wait for it; a thread that loses the race drops its copy.
        """
        kernel = self._loaded.get((key, device.index))
        if kernel is not None:
            return kernel
        module, record = entry
        if isinstance(module, Bundle):
            loaded = Kernel(device, module.on(device), record["function"], record.get("metadata"), record.get("tied"))
        else:
            loaded = Kernel(device, LoadedModule(device, module), "main", record.get("metadata"), record.get("tied"))
            if record.get("source"):
                self._unbundled[key] = None
        if record.get("tied") is None:
            loaded.on_probe = lambda tied: self._remember_tied(key, tied)
        with self._lock:
            return self._loaded.setdefault((key, device.index), loaded)

    def _remember_tied(self, key: tuple, tied: tuple[int, ...]) -> None:
        """Keep which inputs a module hands back with its entry, so kernels loaded later (on other
        devices, in later processes) skip the probe that found it (kernel.py)."""
        with self._lock:
            module, record = self._entries.get(key) or (None, None)
            if record is None or record.get("tied") is not None:
                return
            record = dict(record, tied=list(tied))
            self._entries[key] = (module, record)
        if self.store is not None and not isinstance(module, Bundle):  # a bundle's members probe in each process
            self.store.save(digest_of(key), module, record)

    def choice(self, signature: tuple, device: Device) -> dict | None:
        """What was chosen for a signature on a device's target (``keep_choice``), or None."""
        key = self._lookup(signature, device)[1]
        with self._lock:
            if key in self._choices:
                return self._choices[key]
        found = self.store.load_choice(digest_of(key)) if self.store is not None else None
        with self._lock:
            return self._choices.setdefault(key, found)

    def keep_choice(self, signature: tuple, device: Device, choice: dict) -> None:
        """Keep a choice made for a signature on a device's target (plain values: the eager
        layer's executor and the times that chose it), in memory and on disk beside its kernel."""
        key = self._lookup(signature, device)[1]
        with self._lock:
            self._choices[key] = choice
        if self.store is not None:
            self.store.save_choice(digest_of(key), choice)

    def _load_entry(self, key: tuple, digest: str | None = None) -> tuple[bytes | memoryview | Bundle, dict] | None:
        """The store's entry for a key (from a loaded bundle, else its file), kept in memory; or
        None. ``digest`` is the key's, if the caller has it. Called with the lock held."""
        if self.store is None:
            return None
        digest = digest or digest_of(key)
        entry = self._members.pop(digest, None)
        if entry is None:
            entry = self.store.load(digest)
            bundle = entry and entry[1].get("bundle")
            if bundle and config.cache_bundles:
                entry = self._open_bundle(bundle, digest) or entry
        if entry is not None:
            counters.cache_hits_disk += 1
            self._entries[key] = entry
        return entry

    def _raise_stored_failure(self, key: tuple, describe: str) -> None:
        """Raise the store's CompileError for a key that failed to compile before, if any."""
        if self.store is None:
            return
        failure = self.store.load_failure(digest_of(key))
        if failure is not None:
            error = CompileError(f"{describe} failed to compile earlier (cached failure):\n{failure}")
            self._failed[key] = error
            raise copy.copy(error)

    def _open_bundle(self, bundle: str, digest: str) -> tuple[Bundle, dict] | None:
        """A member's entry from its bundle, every other member kept for its first use; None if
        the bundle is gone (evicted, damaged: the member's own entry serves)."""
        found = self.store.load_bundle(bundle)
        if found is None:
            return None
        module, record = found
        shared = Bundle(module)
        for member, info in record["members"].items():
            self._members[member] = (shared, dict(info, bundle=bundle))
        counters.bundles_loaded += 1
        return self._members.pop(digest, None)

    def bundle_at_exit(self) -> None:
        """Start building a bundle of the kernels this process used that are in none (bundles.py)."""
        if not config.cache_bundles or not isinstance(self.store, DiskStore) or not self.store.writable:
            return  # a builder is a process of its own, so it needs a store on disk
        if len(self._unbundled) >= max(2, config.bundle_min_kernels):
            bundles.start_builder(self.store, [digest_of(key) for key in self._unbundled])

    def _compile(  # called without the lock, so that threads compile side by side
        self,
        key: tuple,
        target: Target,
        lower: Callable[[], str] | Sequence[Callable[[], str]],
        describe: str,
        metadata: dict,
    ) -> tuple[bytes, dict]:
        digest = digest_of(key)
        start = time.perf_counter()
        progress.compiling(describe)
        if isinstance(self.store, DiskStore):
            bundles.compiling_in_foreground(self.store)
        try:
            vmfb, text, alternative = _compile_first(lower if isinstance(lower, Sequence) else [lower], target)
        except CompileError as error:
            kind = type(error) if isinstance(error, _SESSION_ONLY) else CompileError  # catchable as what it was
            failure = kind(
                f"IREE could not compile {describe} for {target.backend} ({target.arch or 'default'}):\n{error}\n"
                "turbine runs such ops by its fallback policy (TURBINE_FALLBACK).",
                error.diagnostics,
            )
            with self._lock:
                counters.compile_failures += 1
                self._failed[key] = failure
            if self.store is not None and not isinstance(error, _SESSION_ONLY):
                self.store.save_failure(digest, str(error), {"op": describe})
            raise copy.copy(failure) from None
        finally:
            progress.compiled()
        seconds = time.perf_counter() - start
        with self._lock:
            counters.kernels_compiled += 1
            counters.compile_seconds += seconds
        log.debug("compiled %s in %.2f s", describe, seconds)
        record = {
            "op": describe,
            "signature": repr(key[0]),
            "target": f"{target.backend} {target.arch}".strip(),
            "flags": list(target.flags),
            "compiler": key[1][-1],
            "lowering_version": LOWERING_VERSION,
            "compile_seconds": round(seconds, 3),
            "metadata": dict(metadata, alternative=alternative),
            "source": bundles.bundleable(text, target.backend),  # kept beside the entry, to compile into bundles
        }
        if self.store is not None:
            if record["source"]:
                self.store.save_source(digest, text)
            record = self.store.save(digest, vmfb, record)
        return vmfb, record


def _first_lowered_here(lower: Callable[[], str] | Sequence[Callable[[], str]]) -> list[Callable[[], str]]:
    """``lower``'s alternatives with the first one traced now, in the calling thread.

    A trace sets torch.fx's process-wide state: ``nn.Module.__call__`` patched and
    ``is_fx_tracing()`` true. Done in a compile thread, it showed to the user's code running
    meanwhile: a ``torch.compile``d function then refused to run ("Detected that you are using
    FX to symbolically trace a dynamo-optimized function"). Later alternatives, needed only when
    the first does not compile, are traced in the compile thread.
    """
    lowerings = list(lower) if isinstance(lower, Sequence) else [lower]
    try:
        text = lowerings[0]()
    except Exception as error:  # _compile_first reports it with the other alternatives' errors
        lowerings[0] = functools.partial(_raise, error)
    else:
        lowerings[0] = lambda: text
    return lowerings


#: Failures kept for the session, not on disk: another process may well compile the kernel.
_SESSION_ONLY = (CompileTimeout, CompilerCrash)


def _raise(error: Exception) -> str:
    raise error


def _compile_first(lowerings: Sequence[Callable[[], str]], target: Target) -> tuple[bytes, str, int]:
    """The module, MLIR and position of the first lowering that compiles; else the first lowering's
    error, with the first line of each other lowering's error after it (a decomposition's own
    failure, say). A lowering whose text is one that already failed is not compiled again."""
    errors: list[tuple[int, CompileError]] = []
    failed: set[str] = set()
    for alternative, lower in enumerate(lowerings):
        try:
            text = lower()
        except CompileError as error:
            errors.append((alternative, error))
            continue
        except Exception as error:  # tracing failed (a data-dependent shape inside a decomposition, say)
            errors.append((alternative, CompileError(f"turbine could not lower it: {type(error).__name__}: {error}")))
            continue
        if text in failed:
            continue
        try:
            return compile_mlir(text, target), text, alternative
        except CompileError as error:
            errors.append((alternative, error))
            failed.add(text)
    (_, first), *others = errors
    if not others:
        raise first
    lines = "\n".join(f"alternative {i + 1}: {_first_line(str(e))}" for i, e in others)
    kind = next((type(e) for _, e in errors if isinstance(e, _SESSION_ONLY)), CompileError)
    raise kind(f"{first}\n{lines}", first.diagnostics)


def _first_line(message: str) -> str:
    return next((line for line in message.splitlines() if line.strip()), message)[:300]


def default_store() -> DiskStore | None:
    """The disk store ``turbine.config`` asks for (None when ``TURBINE_CACHE=0``)."""
    if not config.cache_enabled:
        return None
    return DiskStore(config.cache_dir, config.cache_max_bytes)


kernel_cache = KernelCache(default_store())
atexit.register(kernel_cache.bundle_at_exit)
