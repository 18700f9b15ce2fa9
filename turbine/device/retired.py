"""Memory turbine dropped that another library may still be reading.

torch reads IREE's buffers through DLPack on its own CUDA streams, which IREE cannot see: a buffer
torch read must not go back to IREE's allocator (which gives the memory to its next result)
until those reads are done. An event recorded after every read cost 8.9 us a read on the H200's
host, more than torch's own small op; so a buffer only notes which streams read it (its
``reader``, an object of the reading library: eager's TorchReads), and as it dies a marker is
placed on each of those streams and the memory is kept here until the markers are passed. Kept
memory is let go without waiting as later buffers retire, and waited for when too much is kept
or the device is synchronized.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Protocol


class Reads(Protocol):
    """What a buffer's reader gives as the buffer dies: whether the reads queued so far are done."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


#: Kept buffers past which the oldest is waited for (a GPU far behind its host).
LIMIT = 256


class Retired:
    """One device's memory waiting for other libraries' reads, oldest first."""

    def __init__(self) -> None:
        self._kept: collections.deque[tuple[Reads, Any]] = collections.deque()
        self._lock = threading.Lock()

    def keep(self, reads: Reads, memory: Any) -> None:
        """Keep ``memory`` (the objects that hold it) until ``reads`` are done."""
        self._kept.append((reads, memory))
        self.let_go(wait=len(self._kept) > LIMIT)

    def let_go(self, wait: bool = False) -> None:
        """Drop the kept memory whose reads are done, oldest first; with ``wait``, wait for the
        oldest first (the others are likely done by then). Where another call is at it (another
        thread, or a buffer dying inside this one's drops), this one leaves it to that."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            kept = self._kept
            if wait and kept:
                kept[0][0].synchronize()
            while kept and kept[0][0].query():
                kept.popleft()
        finally:
            self._lock.release()

    def __len__(self) -> int:
        return len(self._kept)
