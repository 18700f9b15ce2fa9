"""The on-disk kernel store: compiled modules that outlive the process, trusted like ccache.

Layout under the cache directory::

    kernels/<d[:2]>/<digest>.vmfb    the compiled module
    kernels/<d[:2]>/<digest>.json    its record: op, signature, target, sizes, sha256, times
    failed/<digest>.json             a signature that failed to compile (a negative entry)

The digest is a sha256 of the full cache key (signature, target, compiler version, lowering
version), so a new compiler or lowering never reads an old entry. Every file is written to a
temporary name and renamed into place, so readers see a whole entry or none, and processes that
compile the same signature at once each leave a valid entry. A module's mtime is its last use;
the store evicts least recently used modules past its size limit. A store that cannot write
(read-only or full directory) warns once and the process carries on from memory.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

import filelock

log = logging.getLogger("turbine")


class CacheWarning(UserWarning):
    """The kernel cache could not be used as asked (corrupt entry, unwritable directory)."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class DiskStore:
    """A directory of compiled kernels and failed signatures; see the module docstring."""

    def __init__(self, root: str | os.PathLike, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.writable = True
        self._warned: set[str] = set()
        try:
            (self.root / "kernels").mkdir(parents=True, exist_ok=True)
            (self.root / "failed").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            self._stop_writing(error)

    # --- paths ----------------------------------------------------------------------------

    def _module_path(self, digest: str) -> Path:
        return self.root / "kernels" / digest[:2] / f"{digest}.vmfb"

    def _record_path(self, digest: str) -> Path:
        return self.root / "kernels" / digest[:2] / f"{digest}.json"

    def _failure_path(self, digest: str) -> Path:
        return self.root / "failed" / f"{digest}.json"

    # --- reading --------------------------------------------------------------------------

    def load(self, digest: str) -> tuple[bytes, dict] | None:
        """The module for a digest and its record, or None. A damaged entry is removed (one warning) and misses."""
        path = self._module_path(digest)
        try:
            data = path.read_bytes()
            record = json.loads(self._record_path(digest).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as error:
            self._warn_once("unreadable", f"turbine's kernel cache at {self.root} cannot be read ({error.strerror}).")
            return None
        except (OSError, ValueError) as error:
            self._discard(digest, f"unreadable ({error})")
            return None
        if record.get("bytes") != len(data) or record.get("sha256") != hashlib.sha256(data).hexdigest():
            self._discard(digest, "truncated or corrupt (size or checksum does not match its record)")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the mtime is the last use, for eviction and `cache list`
        return data, record

    def load_failure(self, digest: str) -> str | None:
        """The compiler's message for a signature that failed before, or None."""
        try:
            return json.loads(self._failure_path(digest).read_text())["error"]
        except (OSError, ValueError, KeyError):
            return None

    # --- writing --------------------------------------------------------------------------

    def save(self, digest: str, vmfb: bytes, record: dict) -> None:
        record = dict(record, bytes=len(vmfb), sha256=hashlib.sha256(vmfb).hexdigest(), created=_now())
        if not self._write(self._module_path(digest), vmfb):
            return
        # The record lands last: a module without its record reads as missing, never as valid.
        if self._write(self._record_path(digest), json.dumps(record, indent=1).encode()):
            self._evict()

    def save_failure(self, digest: str, message: str, record: dict) -> None:
        self._write(self._failure_path(digest), json.dumps(dict(record, error=message, created=_now())).encode())

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

    def _discard(self, digest: str, why: str) -> None:
        self._warn_once(
            f"corrupt-{digest}", f"turbine's kernel cache entry {digest[:12]} was {why}; it is removed and recompiled."
        )
        for path in (self._module_path(digest), self._record_path(digest)):
            with contextlib.suppress(OSError):
                path.unlink()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, CacheWarning, stacklevel=4)

    # --- size limit -----------------------------------------------------------------------

    def _evict(self) -> None:
        """Remove least recently used modules until the store fits in ``max_bytes``."""
        entries = list(self.entries())
        total = sum(e["bytes"] for e in entries)
        if total <= self.max_bytes:
            return
        with filelock.FileLock(str(self.root / ".evict.lock"), timeout=10):
            for entry in sorted(entries, key=lambda e: e["last_used"]):
                if total <= self.max_bytes:
                    break
                self.remove(entry["digest"])
                total -= entry["bytes"]
                log.info("kernel cache: evicted %s (%d bytes)", entry["op"], entry["bytes"])

    # --- listing and clearing (the CLI) ---------------------------------------------------

    def entries(self) -> Iterator[dict]:
        """Every complete entry: digest, op, bytes, created, last_used (a timestamp), record."""
        for record_path in (self.root / "kernels").glob("*/*.json"):
            module = record_path.with_suffix(".vmfb")
            try:
                record = json.loads(record_path.read_text())
                stat = module.stat()
            except (OSError, ValueError):
                continue
            yield {
                "digest": record_path.stem,
                "op": record.get("op", "?"),
                "bytes": stat.st_size,
                "created": record.get("created", "?"),
                "last_used": stat.st_mtime,
                "record": record,
            }

    def failures(self) -> list[dict]:
        found = []
        for path in (self.root / "failed").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                found.append(dict(json.loads(path.read_text()), digest=path.stem))
        return found

    def remove(self, digest: str) -> None:
        for path in (self._module_path(digest), self._record_path(digest)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def clear(self, failed_only: bool = False) -> int:
        """Delete every entry (or only the negative ones); returns how many went."""
        count = 0
        for path in (self.root / "failed").glob("*.json"):
            path.unlink()
            count += 1
        if not failed_only:
            for entry in list(self.entries()):
                self.remove(entry["digest"])
                count += 1
            for leftover in (self.root / "kernels").glob("*/.tmp-*"):
                leftover.unlink()
        return count
