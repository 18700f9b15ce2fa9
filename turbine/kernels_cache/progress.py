"""Showing that kernels are compiling, so a first forward pass does not look hung.

A burst of compiles (two or more, each started within a second of the last) shows a tqdm bar
in terminals and notebooks, naming the op being compiled; elsewhere each compile is a log line
on the ``turbine`` logger. Nothing shows while kernels come from the caches, and the bar goes
away at the first cache hit after the burst. ``TURBINE_PROGRESS=0`` turns it off.
"""

from __future__ import annotations

import logging
import sys
import time

from turbine.config import config

log = logging.getLogger("turbine")

#: Seconds between compiles that still count as one burst.
BURST_GAP = 1.0


def _interactive() -> bool:
    return "ipykernel" in sys.modules or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


class CompileProgress:
    """Counts the compiles of the current burst and shows them (see the module docstring)."""

    def __init__(self) -> None:
        self.bar = None
        self.count = 0
        self.last = 0.0

    def compiling(self, describe: str) -> None:
        """Called as a compile starts."""
        now = time.monotonic()
        if now - self.last > BURST_GAP:
            self.close()
            self.count = 0
        self.last = now
        if not config.progress:
            return
        if self.bar is None and self.count >= 1 and _interactive():
            from tqdm.auto import tqdm

            self.bar = tqdm(desc="turbine: compiling kernels", unit="kernel", initial=self.count, leave=False)
        if self.bar is not None:
            self.bar.set_postfix_str(describe[:70], refresh=True)
        else:
            log.info("compiling %s (kernel %d of this burst)", describe, self.count + 1)

    def compiled(self) -> None:
        """Called as a compile ends (or fails)."""
        self.count += 1
        self.last = time.monotonic()
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        """End the burst's bar (at a cache hit once compiling stopped)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


progress = CompileProgress()
