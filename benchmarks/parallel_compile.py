"""Would compiling several new kernels at once pay on this machine? (issue 3, item 8)

    python benchmarks/parallel_compile.py [--kernels 4]

Lowers ``--kernels`` distinct single-op kernels, then compiles them through turbine's compiler
processes (kernels_cache/compiler.py) one after another and from as many threads at once, and
prints both times. Up to ``TURBINE_COMPILE_JOBS`` processes compile at once.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch

from turbine.config import config
from turbine.eager import lowering
from turbine.kernels_cache import Target, compile_mlir


def kernel_text(index: int) -> str:
    shape = (16 + index, 32)
    return lowering.lower(
        lambda a, b: [torch.tanh(a @ b.t()) * (index + 1)], [(shape, torch.float32), (shape, torch.float32)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=4)
    args = parser.parse_args()
    target = Target("llvm-cpu", "host", ())
    texts = [kernel_text(i) for i in range(args.kernels)]
    warm = [threading.Thread(target=compile_mlir, args=(text, target)) for text in texts]
    for thread in warm:  # start the compiler processes before timing
        thread.start()
    for thread in warm:
        thread.join()

    start = time.perf_counter()
    for text in texts:
        compile_mlir(text, target)
    sequential = time.perf_counter() - start

    threads = [threading.Thread(target=compile_mlir, args=(text, target)) for text in texts]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    parallel = time.perf_counter() - start

    print(f"{args.kernels} kernels on {os.cpu_count()} cores, {config.compile_jobs} compiler processes")
    print("| compile | seconds | speed-up |")
    print("|---|---|---|")
    print(f"| one after another | {sequential:.2f} | 1.00 |")
    print(f"| {args.kernels} threads at once | {parallel:.2f} | {sequential / parallel:.2f} |")


if __name__ == "__main__":
    main()
