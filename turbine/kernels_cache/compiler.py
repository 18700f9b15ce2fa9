"""The in-process IREE compiler driver: MLIR text in, a VM flatbuffer out, diagnostics captured.

The compiler prints diagnostics on the C-level stderr only, so compile() points file descriptor 2
at a temporary file while it runs; a lock keeps two compiles from mixing their messages.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from typing import Iterator

import iree.compiler.api as api

from turbine.errors import CompileError
from turbine.kernels_cache.target import Target

_lock = threading.Lock()


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to fd 2 inside the block (the list gets one string)."""
    captured: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))


def first_error_lines(diagnostics: str, count: int = 6) -> str:
    """The lines of a diagnostic dump that say what went wrong, without the long IR dumps."""
    lines = [line for line in diagnostics.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if "error:" in line]
    start = errors[0] if errors else 0
    return "\n".join(line[:300] for line in lines[start : start + count])


def compile_mlir(text: str, target: Target) -> bytes:
    """Compile one torch-dialect module for a target. Raises CompileError quoting the compiler."""
    with _lock, _captured_stderr() as captured:
        session = api.Session()
        try:
            session.set_flags(*target.compile_flags())
            invocation = session.invocation()
            invocation.enable_console_diagnostics()
            ok = invocation.parse_source(api.Source.wrap_buffer(session, text.encode()))
            ok = ok and invocation.execute()
            data = b""
            if ok:
                output = api.Output.open_membuffer()
                invocation.output_vm_bytecode(output)
                data = bytes(output.map_memory())
                output.close()
            invocation.close()
        finally:
            session.close()
    if not ok or not data:
        diagnostics = captured[0] if captured else ""
        raise CompileError(first_error_lines(diagnostics) or "the compiler reported failure", diagnostics)
    return data
