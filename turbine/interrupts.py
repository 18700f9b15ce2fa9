"""A Ctrl-C that lands in one of turbine's finalizers is raised again outside it.

Python runs signal handlers between bytecodes of whatever code runs then, finalizers (``__del__``)
included, and an exception raised in a finalizer is reported ("Exception ignored in ...") and
dropped. turbine frees device buffers in finalizers after nearly every op, so a Ctrl-C in a loop of
ops landed in one about one time in twelve (tests/test_exit.py) and was lost: the loop ran on. A
``sys.unraisablehook`` that sees a KeyboardInterrupt dropped in turbine's code asks Python for it
again: a short-lived thread sends the main thread SIGINT once the hook has returned (sent from the
hook itself, it arrived in the hook and was dropped again), which also wakes a main thread that
waits in a blocking call, as the first Ctrl-C would have. Every other unraisable exception goes on
to the hook that was there before.

A process that ends with an uncaught KeyboardInterrupt ends by SIGINT (status 130 in a shell), as
Python ends it, even where an exit hook runs Python source: CPython notes the uncaught interrupt in
a flag that every ``exec`` or ``eval`` of a string clears, and torch._dynamo (which IREE's FX
importer imports, so every turbine process has it) prints its compile times at exit through
``tabulate``, whose import makes namedtuples with ``eval``: where tabulate was installed (the GPU
machine), Ctrl-C ended the process with status 1. turbine's own exit hook, registered before
dynamo's (so run after it), notes the interrupt again.
"""

from __future__ import annotations

import _thread
import atexit
import signal
import sys
import threading
import time
from typing import Any

_previous = sys.unraisablehook


def install() -> None:
    """Put the hook in front of the one there now (once)."""
    global _previous
    if sys.unraisablehook is not _hook:
        _previous = sys.unraisablehook
        sys.unraisablehook = _hook


def _hook(unraisable: Any) -> None:
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _in_turbine(unraisable.object):
        try:
            _thread.start_new_thread(_interrupt_soon, ())
        except RuntimeError:  # no new thread at interpreter shutdown: the process is ending anyway
            pass
        return
    _previous(unraisable)


def _interrupt_soon() -> None:
    """Ctrl-C again for the main thread, a moment after the hook that asked for it returned."""
    time.sleep(0.001)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _in_turbine(source: Any) -> bool:
    """Whether the code an unraisable exception came from (a finalizer, usually) is turbine's."""
    module = getattr(source, "__module__", None) or getattr(type(source), "__module__", "")
    return module == "turbine" or module.startswith("turbine.")


def _still_interrupted() -> None:
    """After an uncaught KeyboardInterrupt, note it again in CPython's flag: a KeyboardInterrupt
    raised out of an ``exec`` of a string is what sets it, so Python then ends itself by SIGINT."""
    if isinstance(getattr(sys, "last_exc", None) or getattr(sys, "last_value", None), KeyboardInterrupt):
        try:
            exec("raise KeyboardInterrupt")
        except KeyboardInterrupt:
            pass


atexit.register(_still_interrupted)  # at import, before turbine imports torch._dynamo: run after its exit hook
