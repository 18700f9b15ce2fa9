"""A compiler process: MLIR text and flags in on stdin, a VM flatbuffer or diagnostics out on stdout.

turbine compiles kernels here rather than in the user's process because IREE's compiler can
crash on some inputs (a division by zero or a bad read in torch-mlir's lowerings): a crash then
ends this process, which turbine reports as a failed compile and replaces, not the user's
session. Each process compiles one kernel at a time, so its C-level stderr (where the compiler
writes diagnostics) belongs to that kernel; several processes compile in parallel.

It is started by path, not as part of the turbine package, so it imports only the IREE compiler
(importing turbine would import torch). Messages are pickles, each preceded by its length.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import tempfile
from typing import Any, BinaryIO

_LENGTH = struct.Struct("<Q")


def send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def receive(stream: BinaryIO) -> Any:
    """The next message, or None at end of stream (the other side is gone)."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        return None
    return pickle.loads(data)


def compile_text(text: str, flags: list[str]) -> tuple[bool, bytes, str]:
    """(ok, module, diagnostics) for one torch-dialect module."""
    import iree.compiler.api as api

    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            session = api.Session()
            try:
                session.set_flags(*flags)
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
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        return ok and bool(data), data, sink.read().decode(errors="replace")


def main() -> None:
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    import iree.compiler.api  # noqa: F401  (load the compiler before the first request)

    send(replies, "ready")
    while True:
        request = receive(requests)
        if request is None:
            return
        text, flags = request
        send(replies, compile_text(text, flags))


if __name__ == "__main__":
    sys.path.pop(0)  # this file's directory: its modules are turbine's, not the worker's
    main()
