"""How much device memory turbine's buffers hold on one device: what ``memory_allocated()`` and
its kin report, as ``torch.cuda``'s do for the CUDA caching allocator."""

from __future__ import annotations


class Memory:
    """Bytes and count of the live buffers turbine holds on a device, and their peaks since the
    device opened or the last ``reset_peak``. Buffers count themselves in and out (buffer.py),
    so the figures fall as soon as the tensors over a buffer are gone.

    Every buffer made and freed passes here, so the counts are kept without a lock (a lock per
    buffer cost 1 us of a 20 us op): two threads making buffers at the very same moment may
    leave a count off by one buffer, as a figure read while others run is anyway."""

    __slots__ = ("live", "count", "peak", "peak_count")

    def __init__(self) -> None:
        self.live = self.count = self.peak = self.peak_count = 0

    def held(self, nbytes: int) -> None:
        self.live += nbytes
        self.count += 1
        if self.live > self.peak:
            self.peak = self.live
        if self.count > self.peak_count:
            self.peak_count = self.count

    def released(self, nbytes: int) -> None:
        self.live -= nbytes
        self.count -= 1

    def reset_peak(self) -> None:
        self.peak, self.peak_count = self.live, self.count

    def stats(self) -> dict[str, int]:
        """torch.cuda.memory_stats()'s keys for what turbine can count."""
        return {
            "allocated_bytes.all.current": self.live,
            "allocated_bytes.all.peak": self.peak,
            "allocation.all.current": self.count,
            "allocation.all.peak": self.peak_count,
        }
