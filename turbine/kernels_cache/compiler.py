"""Compiling kernels in compiler processes: MLIR text in, a VM flatbuffer out, diagnostics kept.

IREE's compiler runs in separate processes (compile_worker.py), a pool of up to
``config.compile_jobs``: a compiler crash then fails one compile instead of ending the user's
session, each process's stderr holds one kernel's diagnostics, and threads that need kernels at
the same time compile them in parallel. A process is started on first need (about a second, to
load the compiler) and kept for the next compile.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from turbine.config import config
from turbine.errors import CompileError, CompilerCrash, CompileTimeout
from turbine.kernels_cache import compile_worker
from turbine.kernels_cache.target import Target

_WORKER = Path(compile_worker.__file__)


class _CompilerProcess:
    """One compiler process and its pipes; its stderr goes to a file, for crash reports."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile(mode="w+b")
        self.stopped = False  # by the watchdog of a compile past config.compile_timeout
        self.process = subprocess.Popen(
            [sys.executable, str(_WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log
        )
        if compile_worker.receive(self.process.stdout) != "ready":
            raise CompileError(f"turbine could not start an IREE compiler process: {self.crash_report()}")

    def compile(self, text: str, flags: list[str]) -> tuple[bool, bytes, str]:
        compile_worker.send(self.process.stdin, (text, flags))
        limit = config.compile_timeout
        watchdog = threading.Timer(limit, self._stop) if limit > 0 else None
        self.stopped = False
        if watchdog is not None:
            watchdog.daemon = True
            watchdog.start()
        try:
            reply = compile_worker.receive(self.process.stdout)
        finally:
            if watchdog is not None:
                watchdog.cancel()
        if reply is None and self.stopped:
            raise CompileTimeout(
                f"the IREE compiler took more than {limit:g} s on this kernel and was stopped (TURBINE_COMPILE_TIMEOUT "
                "sets the limit in seconds, 0 for none); the next compile starts a new compiler process."
            )
        if reply is None:
            raise CompilerCrash(
                f"the IREE compiler crashed on this kernel ({self.crash_report()}); your session goes on "
                "and the next compile starts a new compiler process."
            )
        return reply

    def _stop(self) -> None:
        """The watchdog's end of a compile past the time limit: the process is killed, which ends
        the compile's reply early."""
        self.stopped = True
        self.process.kill()

    def crash_report(self) -> str:
        status = self.process.wait(timeout=30)
        if status < 0:
            reason = f"signal {signal.Signals(-status).name}"
        else:
            reason = f"exit status {status}"
        self.log.seek(0)
        lines = [line for line in self.log.read().decode(errors="replace").splitlines() if line.strip()]
        return reason + (f": {lines[-1][:200]}" if lines else "")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()
        self.log.close()


class _Pool:
    """Idle compiler processes, and a limit on how many compile at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_CompilerProcess] = []
        self._slots: threading.Semaphore | None = None

    @contextlib.contextmanager
    def process(self) -> Iterator[_CompilerProcess]:
        """A compiler process for one compile; dropped (not reused) when the compile fails to finish."""
        with self._lock:
            if self._slots is None:
                self._slots = threading.Semaphore(max(1, config.compile_jobs))
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            worker = worker or _CompilerProcess()
            try:
                yield worker
            except BaseException:
                worker.close()  # a crash, or Ctrl-C while it compiled: its pipe is out of step
                raise
            if worker.stopped:  # the time limit struck as its reply came: the process is gone
                worker.close()
                return
            with self._lock:
                self._idle.append(worker)

    def close(self) -> None:
        with self._lock:
            for worker in self._idle:
                worker.close()
            self._idle.clear()


_pool = _Pool()
atexit.register(_pool.close)


def first_error_lines(diagnostics: str, count: int = 6) -> str:
    """The lines of a diagnostic dump that say what went wrong, without the long IR dumps."""
    lines = [line for line in diagnostics.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if "error:" in line]
    start = errors[0] if errors else 0
    return "\n".join(line[:300] for line in lines[start : start + count])


def compile_mlir(text: str, target: Target) -> bytes:
    """Compile one torch-dialect module for a target. Raises CompileError quoting the compiler."""
    flags = list(target.compile_flags())
    with _pool.process() as worker:
        ok, data, diagnostics = worker.compile(text, flags)
    if not ok and _lacks_a_libm_function(target, diagnostics):
        with _pool.process() as worker:
            ok, data, diagnostics = worker.compile(text, flags + [_SYSTEM_LINKED])
    if not ok:
        raise CompileError(first_error_lines(diagnostics) or "the compiler reported failure", diagnostics)
    return data


#: A CPU kernel as a system shared library, linked against the C library's libm. IREE's CPU
#: kernels are self-contained (embedded) ELF files that carry their own math: IREE 3.13 has no
#: float64 sin, cos, tan, asin, acos, tanh, log2 or fmod of its own, so such kernels fail to
#: link ("undefined symbol: sin"). Only those are linked this way (a library is loaded with
#: dlopen, slower to load than an embedded kernel). float64 erf does not get this far: IREE
#: cannot legalize its vectors at all (decompositions/erf.py has turbine's series).
_SYSTEM_LINKED = "--iree-llvmcpu-link-embedded=false"


def _lacks_a_libm_function(target: Target, diagnostics: str) -> bool:
    return target.backend == "llvm-cpu" and "undefined symbol" in diagnostics
