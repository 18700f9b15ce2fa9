"""Kernel bundles: the kernels a process used, compiled into one module for the next process.

Why: a new process loads every kernel it runs from the disk store. On turbine:cpu a kernel costs
about 80 us to read and check and 60-120 us to instantiate (IREE's loader maps each module's
code); a CUDA module costs more. A model's first steps use tens of kernels, so a new process
pays milliseconds before it runs as fast as one that has run them already. A bundle holds many kernels in one
module, one function each: one read and one instantiation for all of them.

When: a process that used at least ``config.bundle_min_kernels`` kernels that are in no bundle
queues a job as it exits and starts a builder, unless one is at work on the cache directory
already (it takes the job next): a detached, low-priority process (as ``git gc --auto`` does)
that waits while other processes compile kernels in the foreground, then compiles their MLIR together (42 kernels: 4-8 s on 2 cores, against 12-13 s one by one),
writes the bundle atomically, then names the bundle in each member's entry. A later process
that reads a member's entry loads the bundle and takes the other members from it without
reading the disk again. Members keep their own entries, so an evicted or damaged bundle costs only the time it
would have saved.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path

import filelock

from turbine.config import config
from turbine.errors import CompileError
from turbine.kernels_cache.compiler import compile_mlir
from turbine.kernels_cache.store import DiskStore
from turbine.kernels_cache.target import Target, compiler_version

#: The most kernels one bundle holds: a process that ran thousands of ops (the coverage suite)
#: bundles the first it used rather than spend minutes compiling after it exits.
MAX_MEMBERS = 256

#: Targets whose kernels join bundles. On cuda a kernel is PTX that the driver compiles when it
#: loads (and caches by the PTX's hash): the first process to load a 42-kernel bundle on an H200
#: paid 0.78 s for that, against 13 ms saved by each later one, so cuda kernels load one by one
#: until a builder can hand the driver ready code. hip and vulkan are not measured yet.
BACKENDS = ("llvm-cpu",)

#: A builder's job file older than this belongs to a builder that was killed.
_STALE_SECONDS = 3600

#: A foreground compile's note holds a builder back for this long after it was last touched.
_FOREGROUND_SECONDS = 2.0


def bundleable(text: str, backend: str) -> bool:
    """Whether a kernel can join a bundle: a target in BACKENDS, and MLIR with one ``@main``
    function and no resource blobs (large constants, whose names could clash with another member's)."""
    return backend in BACKENDS and text.startswith("module {") and text.count("func.func ") == 1 and text.count("@main(") == 1 and "{-#" not in text


def merge(sources: dict[str, str]) -> str:
    """One module holding every source's ``@main``, renamed to the source's key."""
    bodies = []
    for name, text in sources.items():
        body = text[text.index("{") + 1 : text.rindex("}")]
        bodies.append(body.replace("func.func @main(", f"func.func @{name}(", 1))
    return "module {" + "".join(bodies) + "}\n"


def build(store: DiskStore, digests: list[str]) -> str | None:
    """Compile a bundle of the entries named that can join one and mark them; returns the
    bundle's digest, or None when fewer than two can or the same bundle failed to compile before."""
    members, sources, target = _members(store, digests)
    if len(members) < 2:
        return None
    bundle = hashlib.sha256(" ".join(sorted(members)).encode()).hexdigest()
    if store.load_failure(bundle) is not None:
        return None
    backend, _, arch = target[0].partition(" ")
    try:
        module = compile_mlir(merge(sources), Target(backend, arch, target[1]))
    except CompileError as error:
        store.save_failure(bundle, str(error), {"op": f"bundle of {len(members)} kernels"})
        return None
    store.save_bundle(bundle, module, members)
    for digest in members:
        found = store.load(digest)
        if found is not None:
            store.save(digest, found[0], dict(found[1], bundle=bundle))
    return bundle


def _members(store: DiskStore, digests: list[str]) -> tuple[dict[str, dict], dict[str, str], tuple | None]:
    """The entries that can join a bundle, in order, up to MAX_MEMBERS: each with its source
    kept, in no bundle yet, from this compiler, for the first one's target (target, flags).
    Returns what the bundle says of each (by digest), their sources (by function), the target."""
    members: dict[str, dict] = {}
    sources: dict[str, str] = {}
    target = None
    for digest in digests:
        if len(members) == MAX_MEMBERS:
            break
        found = store.load(digest)
        if found is None:
            continue
        record = found[1]
        if "bundle" in record and os.path.exists(store.bundle_path(record["bundle"])):
            continue
        text = store.load_source(digest)
        entry_target = (record.get("target", ""), tuple(record.get("flags", ())))
        backend = entry_target[0].partition(" ")[0]
        if text is None or not bundleable(text, backend) or record.get("compiler") != compiler_version():
            continue
        target = target or entry_target
        if entry_target != target:
            continue
        name = f"k{len(members)}"
        sources[name] = text
        members[digest] = {"function": name, "metadata": record.get("metadata", {}), "tied": record.get("tied")}
    return members, sources, target


def start_builder(store: DiskStore, digests: list[str]) -> None:
    """Queue a bundle of these entries, and start a detached, low-priority builder process unless
    one is already at work on this cache directory: that one takes the queued job next, so at most
    one builder runs per cache directory (module docstring)."""
    jobs = store.root / "building"
    try:
        jobs.mkdir(exist_ok=True)
        job = jobs / f"{time.time():.6f}-{uuid.uuid4().hex[:8]}.json"
        job.write_text(json.dumps(digests[: MAX_MEMBERS * 2]))
        if _builder_at_work(store):
            return
        subprocess.Popen(
            [sys.executable, "-m", "turbine.kernels_cache.bundles", str(store.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the user's program does not reach it
            env=dict(os.environ, TURBINE_CACHE_DIR=str(store.root), TURBINE_COMPILE_JOBS="1"),
        )
    except OSError:
        pass  # a bundle only saves time; the process exits as it would have without one


def compiling_in_foreground(store: DiskStore) -> None:
    """Note that this process is compiling kernels a program waits for: a builder holds its own
    compile back while such a note is fresh (``_FOREGROUND_SECONDS``)."""
    with contextlib.suppress(OSError):
        notes = store.root / "foreground"
        notes.mkdir(exist_ok=True)
        (notes / str(os.getpid())).touch()


def building(cache_dir: str | os.PathLike) -> list[dict]:
    """The bundle jobs of a cache directory, oldest first: each with its kernel count, its age in
    seconds and whether a builder is at work on it (``python -m turbine cache info``)."""
    jobs = Path(cache_dir) / "building"
    found = []
    for job in sorted(jobs.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append({"kernels": len(json.loads(job.read_text())), "age": time.time() - job.stat().st_mtime,
                          "active": job.with_suffix(".active").exists()})
    return found


def wait_for_builders(cache_dir: str | os.PathLike, timeout: float = 600.0) -> bool:
    """Wait until no bundle builder of this cache directory is running; False on timeout.

    For programs that measure a warm start (benchmarks/cache.py) right after a cold one."""
    jobs = Path(cache_dir) / "building"
    deadline = time.monotonic() + timeout
    while _running(jobs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _running(jobs: Path) -> bool:
    now = time.time()
    for job in jobs.glob("*.json"):
        with contextlib.suppress(OSError):
            if now - job.stat().st_mtime < _STALE_SECONDS:
                return True
    return False


def _builder_at_work(store: DiskStore) -> bool:
    """Whether a builder holds this cache directory's bundle lock now."""
    lock = filelock.FileLock(str(store.root / ".bundle.lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    lock.release()
    return False


def _wait_for_foreground(store: DiskStore) -> None:
    """Hold back while a process compiles kernels its program waits for (at most ten minutes)."""
    notes = store.root / "foreground"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        now = time.time()
        fresh = [n for n in notes.glob("*") if now - n.stat().st_mtime < _FOREGROUND_SECONDS] if notes.exists() else []
        if not fresh:
            return
        time.sleep(0.5)


def _run_builder(root: Path) -> None:
    """The builder: the queued jobs, oldest first, until none is left; one builder per cache
    directory (the lock), each compile held back while a foreground process compiles.

    A process that queued a job while this builder held the lock saw it at work and started none:
    so after letting the lock go, the builder looks once more, and goes on if a job came."""
    store = DiskStore(root, config.cache_max_bytes)
    lock = filelock.FileLock(str(root / ".bundle.lock"))
    while True:
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            return  # another builder is at work and will take the queued jobs
        try:
            while jobs := sorted((root / "building").glob("*.json")):
                _run_job(store, jobs[0])
        finally:
            lock.release()
        if not any((root / "building").glob("*.json")):
            return


def _run_job(store: DiskStore, job: Path) -> None:
    active = job.with_suffix(".active")
    try:
        digests = json.loads(job.read_text())
        active.touch()
        _wait_for_foreground(store)
        build(store, digests)
    except Exception:  # detached, with no terminal: whatever went wrong goes to a file
        with contextlib.suppress(OSError):
            (job.parent / "error.log").write_text(traceback.format_exc())
    finally:
        for done in (job, active):
            with contextlib.suppress(OSError):
                done.unlink()


if __name__ == "__main__":  # the detached builder process, at low priority
    with contextlib.suppress(OSError):
        os.nice(10)
    _run_builder(Path(sys.argv[1]))
