"""Would compiling several new kernels at once pay on this machine? (issue 3, item 8)

    python benchmarks/parallel_compile.py [--kernels 4]

Lowers ``--kernels`` distinct single-op kernels, then compiles them with IREE's in-process
compiler one after another and from as many threads at once, and prints both times. The
compiler releases the GIL, so threads overlap where cores are free.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import iree.compiler.api as api

from turbine.eager import lowering
from turbine.kernels_cache import Target


def compile_text(text: str, flags: list[str]) -> bytes:
    session = api.Session()
    session.set_flags(*flags)
    invocation = session.invocation()
    invocation.parse_source(api.Source.wrap_buffer(session, text.encode()))
    assert invocation.execute(), "compile failed"
    output = api.Output.open_membuffer()
    invocation.output_vm_bytecode(output)
    return bytes(output.map_memory())


def kernel_text(index: int) -> str:
    shape = (16 + index, 32)
    return lowering.lower(
        lambda a, b: [torch.tanh(a @ b.t()) * (index + 1)], [(shape, torch.float32), (shape, torch.float32)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=4)
    args = parser.parse_args()
    flags = Target("llvm-cpu", "host", ()).compile_flags()
    texts = [kernel_text(i) for i in range(args.kernels)]
    compile_text(texts[0], flags)  # warm the compiler up

    start = time.perf_counter()
    for text in texts:
        compile_text(text, flags)
    sequential = time.perf_counter() - start

    threads = [threading.Thread(target=compile_text, args=(text, flags)) for text in texts]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    parallel = time.perf_counter() - start

    print(f"{args.kernels} kernels on {os.cpu_count()} cores")
    print("| compile | seconds | speed-up |")
    print("|---|---|---|")
    print(f"| one after another | {sequential:.2f} | 1.00 |")
    print(f"| {args.kernels} threads at once | {parallel:.2f} | {sequential / parallel:.2f} |")


if __name__ == "__main__":
    main()
