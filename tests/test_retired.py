"""Memory another library still reads is kept until its reads are done (device/retired.py); the
GPU case itself is in test_gpu.py."""

from __future__ import annotations

import threading

from turbine.device import retired
from turbine.device.retired import Retired


class FakeReads:
    """Reads that are done once ``done`` is set; ``synchronize`` waits for that."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waited = False

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.waited = True
        self.done.wait(5)


def test_memory_is_kept_until_its_reads_are_done_and_let_go_oldest_first():
    kept = Retired()
    first, second = FakeReads(), FakeReads()
    kept.keep(first, "memory 1")
    kept.keep(second, "memory 2")
    assert len(kept) == 2
    second.done.set()  # the newer is done, the older not: both stay (released in order)
    kept.let_go()
    assert len(kept) == 2
    first.done.set()
    kept.let_go()
    assert len(kept) == 0
    assert not first.waited and not second.waited  # nothing waited on the host


def test_past_the_limit_the_oldest_is_waited_for(monkeypatch):
    monkeypatch.setattr(retired, "LIMIT", 2)
    kept = Retired()
    reads = [FakeReads() for _ in range(3)]
    threading.Timer(0.05, reads[0].done.set).start()
    for number, one in enumerate(reads):
        kept.keep(one, f"memory {number}")
    assert reads[0].waited and len(kept) == 2


def test_a_drop_inside_a_drop_does_not_deadlock():
    """A buffer may die (and retire its memory) while the kept memory is being let go: the inner
    call leaves the work to the outer one."""
    kept = Retired()

    class DiesOnQuery(FakeReads):
        def query(self) -> bool:
            kept.keep(FakeReads(), "memory freed by a finalizer")
            return True

    kept.keep(DiesOnQuery(), "memory")
    assert len(kept) == 1  # the inner one, not yet done
