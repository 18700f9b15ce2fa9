"""The on-disk kernel store: compiled modules that outlive the process, trusted like ccache.

Layout under the cache directory::

    kernels/<d[:2]>/<digest>.kernel  one file per entry, three parts:
                                      line 1: the sha256 of everything after it
                                      line 2: its record, as JSON: op, signature, target, sizes, times
                                      then the compiled module
    kernels/<d[:2]>/<digest>.mlir    the MLIR the entry was compiled from, for bundles
    kernels/<d[:2]>/<digest>.bundle  a bundle: one module holding many entries' kernels
                                      (bundles.py), laid out as an entry; its record names
                                      each member's function, metadata and tied inputs
    failed/<digest>.json             a signature (or a bundle) that failed to compile
    chosen/<digest>.json             what the eager layer chose for a signature: the executor
                                      that runs it, and the times that chose it
    plans/<name>.plans               plans the eager layer keeps for a device (eager/saved_plans.py),
                                      laid out as an entry around the eager layer's bytes

One file per entry because a warm process reads one entry per kernel it runs: one open and one
read each, and one checksum that covers the record as well as the module (a record with a
damaged output shape would build a wrong plan). ``sed -n 2p`` shows a record.

The digest is a sha256 of the full cache key (signature, target, compiler version, lowering
version), so a new compiler or lowering never reads an old entry. Every file is written to a
temporary name and renamed into place, so readers see a whole entry or none, and processes that
compile the same signature at once each leave a valid entry. An entry's mtime is its last use;
the store evicts least recently used entries past its size limit. A store that cannot write
(read-only or full directory) warns once and the process carries on from memory.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import mmap
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Iterator

import filelock

log = logging.getLogger("turbine")


class CacheWarning(UserWarning):
    """The kernel cache could not be used as asked (corrupt entry, unwritable directory)."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _parse(data: bytes | mmap.mmap) -> tuple[memoryview, dict]:
    """The module and record of an entry file's bytes; ValueError if it is damaged."""
    checksum_end = data.find(b"\n")
    record_end = data.find(b"\n", checksum_end + 1)
    if checksum_end != 64 or record_end < 0:
        raise ValueError("no checksum and record lines")
    if hashlib.sha256(memoryview(data)[65:]).hexdigest().encode() != data[:64]:
        raise ValueError("checksum does not match")
    record = json.loads(data[65:record_end])
    module = memoryview(data)[record_end + 1 :]
    if record.get("bytes") != len(module):
        raise ValueError("size does not match its record")
    return module, record


def _entry_bytes(module: bytes | memoryview, record: dict) -> bytes:
    """An entry file: checksum line, record line, module. The record line is padded with spaces
    so that the module starts 64 bytes aligned in the file: IREE can then run a bundle straight
    from a mapping of its file (kernel.LoadedModule)."""
    line = json.dumps(record).encode()
    line += b" " * (-(65 + len(line) + 1) % 64)
    body = line + b"\n" + bytes(module)
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


class DiskStore:
    """A directory of compiled kernels and failed signatures; see the module docstring."""

    def __init__(self, root: str | os.PathLike, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.writable = True
        #: Bytes the store holds, as far as this process knows: scanned at its first write, then
        #: counted up by its own writes (an overestimate: rewrites count again), so a write does
        #: not list the directory until the limit may have been passed.
        self._bytes: int | None = None
        self._kernels = os.path.join(root, "kernels")
        self._warned: set[str] = set()
        try:
            (self.root / "kernels").mkdir(parents=True, exist_ok=True)
            (self.root / "failed").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            self._stop_writing(error)

    # --- paths ----------------------------------------------------------------------------

    def entry_path(self, digest: str) -> str:
        """Where a digest's entry lives (a str: this is on every load's path)."""
        return f"{self._kernels}/{digest[:2]}/{digest}.kernel"

    def source_path(self, digest: str) -> str:
        return f"{self._kernels}/{digest[:2]}/{digest}.mlir"

    def bundle_path(self, digest: str) -> str:
        return f"{self._kernels}/{digest[:2]}/{digest}.bundle"

    def plans_path(self, name: str) -> str:
        return f"{self.root}/plans/{name}.plans"

    def _failure_path(self, digest: str) -> Path:
        return self.root / "failed" / f"{digest}.json"

    def _choice_path(self, digest: str) -> Path:
        return self.root / "chosen" / f"{digest}.json"

    # --- reading --------------------------------------------------------------------------

    def load(self, digest: str) -> tuple[memoryview, dict] | None:
        """The module for a digest and its record, or None. A damaged entry is removed (one warning) and misses."""
        return self._read(self.entry_path(digest), f"entry {digest[:12]}", "recompiled")

    def load_bundle(self, digest: str) -> tuple[memoryview, dict] | None:
        """A bundle's module and record (``members``: digest -> function, metadata, tied), or None.

        The module is a view of a read-only mapping of the file, not a copy: a bundle is large
        (365 KB for 42 kernels), and IREE runs it from there (kernel.LoadedModule)."""
        return self._read(self.bundle_path(digest), f"bundle {digest[:12]}", "its kernels load from their own entries", mapped=True)

    def load_plans(self, name: str) -> memoryview | None:
        """The bytes of a plan file, or None (absent; damaged: removed, with one warning)."""
        found = self._read(self.plans_path(name), f"plan file {name}", "its plans are built again")
        return None if found is None else found[0]

    def load_source(self, digest: str) -> str | None:
        """The MLIR an entry was compiled from, or None (an entry from before sources were kept)."""
        try:
            with open(self.source_path(digest), encoding="utf-8") as handle:
                return handle.read()
        except (OSError, ValueError):
            return None

    def _read(self, path: str, what: str, instead: str, mapped: bool = False) -> tuple[memoryview, dict] | None:
        """A file in the entry layout (read, or ``mapped``), its mtime set to now (its last use);
        None if it is absent, unreadable or damaged (then removed, with one warning that names
        what happens ``instead``)."""
        try:
            with open(path, "rb") as handle:
                data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if mapped else handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as error:
            self._warn_once("unreadable", f"turbine's kernel cache at {self.root} cannot be read ({error.strerror}).")
            return None
        except OSError as error:
            self._discard(path, what, f"unreadable ({error})", instead)
            return None
        try:
            module, record = _parse(data)
        except ValueError as error:
            self._discard(path, what, f"truncated or corrupt ({error})", instead)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the mtime is the last use, for eviction and `cache list`
        return module, record

    def load_failure(self, digest: str) -> str | None:
        """The compiler's message for a signature that failed before, or None."""
        try:
            return json.loads(self._failure_path(digest).read_text())["error"]
        except (OSError, ValueError, KeyError):
            return None

    def load_choice(self, digest: str) -> dict | None:
        """What the eager layer chose for a signature (its executor), or None."""
        try:
            choice = json.loads(self._choice_path(digest).read_text())
        except (OSError, ValueError):
            return None
        return choice if isinstance(choice, dict) else None

    # --- writing --------------------------------------------------------------------------

    def save(self, digest: str, module: bytes | memoryview, record: dict) -> dict:
        """Write an entry (replacing any); returns the record as written, with its size and the
        time it was first created (kept when an entry is rewritten)."""
        record = dict(record, bytes=len(module), created=record.get("created") or _now())
        self._save_file(self.entry_path(digest), _entry_bytes(module, record))
        return record

    def save_source(self, digest: str, text: str) -> None:
        self._save_file(self.source_path(digest), text.encode())

    def save_bundle(self, digest: str, module: bytes | memoryview, members: dict) -> None:
        """Write a bundle; ``members`` maps each member's digest to its function and what its
        record says of it (``metadata``, ``tied``)."""
        record = {"members": members, "bytes": len(module), "created": _now()}
        self._save_file(self.bundle_path(digest), _entry_bytes(module, record))

    def _save_file(self, path: str, data: bytes) -> None:
        """Write a file under ``kernels/`` and keep the store within its size limit."""
        if self._write(Path(path), data):
            if self._bytes is None:
                self._bytes = sum(size for _, size, _ in self._entry_files())
            else:
                self._bytes += len(data)
            if self._bytes > self.max_bytes:
                self._evict()

    def update_plans(self, name: str, update: Callable[[memoryview | None], bytes]) -> None:
        """Rewrite a plan file as ``update`` makes it from its current bytes (None if it has
        none), one process at a time: processes that exit together each add their plans."""
        if not self.writable:
            return
        path = Path(self.plans_path(name))
        try:
            path.parent.mkdir(exist_ok=True)
            with filelock.FileLock(str(path.parent / ".lock"), timeout=10):
                data = update(self.load_plans(name))
                self._write(path, _entry_bytes(data, {"bytes": len(data), "created": _now()}))
        except (OSError, filelock.Timeout):
            pass  # plans only save time: a process that cannot write them exits as it would have

    def save_failure(self, digest: str, message: str, record: dict) -> None:
        self._write(self._failure_path(digest), json.dumps(dict(record, error=message, created=_now())).encode())

    def save_choice(self, digest: str, choice: dict) -> None:
        self._write(self._choice_path(digest), json.dumps(dict(choice, created=_now())).encode())

    def _write(self, path: Path, data: bytes) -> bool:
        """Write atomically: a temporary file in the same directory, then a rename."""
        if not self.writable:
            return False
        temporary = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as handle:
                temporary = handle.name
                handle.write(data)
            os.replace(temporary, path)
            temporary = None
            return True
        except OSError as error:
            self._stop_writing(error)
            return False
        finally:
            if temporary is not None:  # an error or Ctrl-C before the rename: leave nothing behind
                with contextlib.suppress(OSError):
                    os.unlink(temporary)

    def _stop_writing(self, error: OSError) -> None:
        self.writable = False
        self._warn_once(
            "unwritable",
            f"turbine's kernel cache at {self.root} cannot be written ({error.strerror or error}); kernels are kept "
            "in memory for this process only. Set TURBINE_CACHE_DIR to a writable directory, or TURBINE_CACHE=0.",
        )

    def _discard(self, path: str, what: str, why: str, instead: str) -> None:
        self._warn_once(f"corrupt-{path}", f"turbine's kernel cache {what} was {why}; it is removed and {instead}.")
        with contextlib.suppress(OSError):
            os.unlink(path)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, CacheWarning, stacklevel=4)

    # --- size limit -----------------------------------------------------------------------

    def _evict(self) -> None:
        """Remove least recently used entries until the store fits in ``max_bytes``."""
        files = list(self._entry_files())
        total = sum(size for _, size, _ in files)
        if total > self.max_bytes:
            with filelock.FileLock(str(self.root / ".evict.lock"), timeout=10):
                for path, size, _ in sorted(files, key=lambda file: file[2]):
                    if total <= self.max_bytes:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    total -= size
                    log.info("kernel cache: evicted %s (%d bytes)", os.path.basename(path), size)
        self._bytes = total

    def _entry_files(self) -> Iterator[tuple[str, int, float]]:
        """(path, bytes, last use) of every file under ``kernels/`` but writes in flight, from the
        directory alone: entries, their sources, bundles, and files an older turbine left in
        another layout, which count toward the size limit too and, unused since, are evicted first."""
        with contextlib.suppress(FileNotFoundError):
            for shard in os.scandir(self._kernels):
                if not shard.is_dir():
                    continue
                for file in os.scandir(shard.path):
                    if not file.name.startswith(".tmp-"):
                        with contextlib.suppress(OSError):
                            stat = file.stat()
                            yield file.path, stat.st_size, stat.st_mtime

    # --- listing and clearing (the CLI) ---------------------------------------------------

    def entries(self) -> Iterator[dict]:
        """Every entry: digest, op, bytes, created, last_used (a timestamp), record."""
        for path, size, last_used in self._entry_files():
            if not path.endswith(".kernel"):
                continue
            try:
                with open(path, "rb") as handle:
                    handle.readline()  # the checksum
                    record = json.loads(handle.readline())
            except (OSError, ValueError):
                continue
            yield {
                "digest": os.path.basename(path).removesuffix(".kernel"),
                "op": record.get("op", "?"),
                "bytes": size,
                "created": record.get("created", "?"),
                "last_used": last_used,
                "record": record,
            }

    def usage(self) -> tuple[int, int]:
        """(bytes, bundles): every file that counts toward the size limit (entries, their
        sources, bundles), and how many bundles there are."""
        files = list(self._entry_files())
        return sum(size for _, size, _ in files), sum(path.endswith(".bundle") for path, _, _ in files)

    def choices(self) -> list[dict]:
        """Every kept choice, with its digest."""
        return self._records("chosen")

    def failures(self) -> list[dict]:
        """Every remembered failed compile, with its digest."""
        return self._records("failed")

    def _records(self, folder: str) -> list[dict]:
        found = []
        for path in (self.root / folder).glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                found.append(dict(json.loads(path.read_text()), digest=path.stem))
        return found

    def remove(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.entry_path(digest))

    def clear(self, failed_only: bool = False) -> int:
        """Delete every entry (or only the negative ones); returns how many went. Files of an
        older layout and leftovers of interrupted writes under ``kernels/`` go too."""
        count = 0
        for path in (self.root / "failed").glob("*.json"):
            path.unlink()
            count += 1
        if not failed_only:
            for path in (self.root / "kernels").glob("*/*"):
                path.unlink()
                count += path.suffix == ".kernel"
            for path in (self.root / "plans").glob("*.plans"):
                path.unlink()
            for path in (self.root / "chosen").glob("*.json"):
                path.unlink()
        return count

    def plan_files(self) -> list[tuple[str, int]]:
        """(name, bytes) of every plan file."""
        return [(path.stem, path.stat().st_size) for path in (self.root / "plans").glob("*.plans")]
