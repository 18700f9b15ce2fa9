"""Errors raised by turbine ops inside autograd's backward, held until the backward call returns.

torch's Python device guard (the only kind a Python backend can register) calls back into
Python from a ``noexcept`` stream-guard destructor in autograd's engine. When an op raises a
Python exception during backward, that destructor runs while the exception is still pending,
the callback fails, and the process ends in ``std::terminate`` without showing the error.

So while a backward runs (``Tensor.backward``, ``torch.autograd.backward`` or ``grad``, seen by
the device mode), a failing op records its error and hands autograd an uninitialised result of
the right shape instead of raising. When the backward call returns, the first recorded error is
raised from there, with its original traceback; the gradients computed are never seen.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch

_state = threading.local()


def active() -> bool:
    """Whether the calling thread is inside a backward call that collects errors."""
    return getattr(_state, "errors", None) is not None


@contextlib.contextmanager
def collecting() -> Iterator[None]:
    """Run a backward call; raise the first error an op recorded during it, once it returns."""
    outer = getattr(_state, "errors", None)
    errors: list[BaseException] = []
    _state.errors = errors
    try:
        yield
    finally:
        _state.errors = outer
    if errors:
        raise errors[0]


def hold(error: BaseException, stand_in: Callable[[], Any]) -> Any:
    """Record ``error`` and return ``stand_in()``, a result autograd can carry on with.

    When no stand-in can be made either, the error is raised after all (and ends the process:
    torch gives no other way out).
    """
    _state.errors.append(error)
    try:
        return stand_in()
    except Exception:
        raise error from None


def uninitialised_like(meta_out: Any, make: Callable[[torch.Tensor], Any]) -> Any:
    """``meta_out``'s structure with each meta tensor replaced by ``make(meta)``."""
    return torch.utils._pytree.tree_map(lambda v: make(v) if isinstance(v, torch.Tensor) else v, meta_out)
