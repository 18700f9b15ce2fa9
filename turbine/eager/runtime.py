"""The eager layer's mutable state, in one object per process (and one per device within it).

Plans, routes, queued launches, runtime-scalar buffers, factory kernels, warned ops and the
per-thread fallback policy live here rather than in module globals, so a test can run on a
fresh runtime (:func:`replaced`) and ``with turbine.fallback(...)`` changes one thread's policy.
Modules read ``runtime.state`` at each use: replacing it takes effect everywhere at once.
What the kernel cache keeps is the kernels_cache layer's own object (``kernel_cache``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Callable, Iterator

from turbine.config import config


class DeviceState:
    """What the runtime keeps per device: its queue of launches waiting on compiles, and the
    0-d buffers holding Python numbers that its kernels take as runtime inputs."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()
        self.scalar_views: dict[tuple, Any] = {}
        #: The plans its saved-plans file holds (eager/saved_plans.py): by op name, pickled until first asked
        #: for and not taken yet; None until read.
        self.saved_plans: dict[str, Any] | None = None


class Runtime:
    """All mutable state of turbine's eager layer in one process."""

    def __init__(self) -> None:
        #: Plan cache: a call's key -> its plan (eager/dispatch.py).
        self.plans: dict[tuple, Callable] = {}
        #: Op -> how dispatch runs it (handler, foreach, composite, planned).
        self.routes: dict[Any, Callable] = {}
        #: Factory kernels by the factory's call (eager/factories.py).
        self.factory_kernels: dict[tuple, tuple] = {}
        #: Whole calls (eager/whole_calls.py): a torch call's key -> (device, vendor ops) where
        #: it runs whole on the vendor's kernels, False where it takes the usual way.
        self.whole_calls: dict[tuple, Any] = {}
        #: Torch functions that run no op (sizes, dtypes): whole_calls does not key them.
        self.not_whole: set[Any] = set()
        #: Families of kernel signatures and the dims they found dynamic (eager/dynamic.py).
        self.families: dict[tuple, Any] = {}
        #: Ops already warned about falling back (once per op and process).
        self.warned: set[str] = set()
        #: Whether this process built a plan that no file gave it: only then does its exit write
        #: the plans (a process that took every plan from disk leaves the file as it was).
        self.built_plans = False
        #: Launches queued on any device (the hot path reads this one number), and above zero
        #: while queued launches run (eager/deferred.py).
        self.backlog = 0
        self.draining = 0
        self.queue_lock = threading.RLock()
        self._devices: dict[int, DeviceState] = {}
        self._threads = threading.local()

    def device(self, index: int) -> DeviceState:
        """The state kept for the device of torch index ``index``."""
        found = self._devices.get(index)
        if found is None:
            found = self._devices.setdefault(index, DeviceState())
        return found

    def device_indices(self) -> list[int]:
        return list(self._devices)

    @property
    def fallback_policy(self) -> str:
        """This thread's fallback policy: its innermost ``turbine.fallback(...)``, else ``config.fallback``."""
        stack = getattr(self._threads, "policies", None)
        return stack[-1] if stack else config.fallback

    @contextlib.contextmanager
    def policy(self, policy: str) -> Iterator[None]:
        """Use ``policy`` on this thread for a block."""
        stack = self._threads.__dict__.setdefault("policies", [])
        stack.append(policy)
        try:
            yield
        finally:
            stack.pop()


state = Runtime()


@contextlib.contextmanager
def replaced(new: Runtime | None = None) -> Iterator[Runtime]:
    """Run a block on another runtime (a fresh one by default), then put the old one back."""
    global state
    old, state = state, new or Runtime()
    try:
        yield state
    finally:
        state = old
