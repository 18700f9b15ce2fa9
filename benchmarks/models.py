"""What library models cost on a turbine device against torch, measured in one run.

    python benchmarks/models.py [--device turbine:cpu] [--models gpt2 llama ...] [--steps 10] [--out FILE]

For each model of tests/library_models.py (transformers' GPT-2, Llama, BERT, T5, ViT, ResNet; small
configs, random weights; and PyTorch's MNIST example network, batch 64), at its ``--size``
(``bench`` by default: hidden 256, 4 layers, 4 x 128 tokens; ``test`` is the tests' tiny size,
where issuing each op costs more than its work), a new process with an empty kernel cache times:

- the cold first training step (forward, backward, AdamW step; its kernels compile then),
- the warm forward pass (eval mode, no_grad), warm training step and, for the decoders, a warm
  greedy ``generate()`` of ``--tokens`` tokens (its second call: each new length compiles new
  kernels the first time),

against torch on the CPU (or ``--torch-device``) in the same process, torch and turbine taking
turns; medians of ``--steps`` repeats. torch runs with as many threads as turbine's CPU device
has IREE workers (``TURBINE_CPU_WORKERS``, stated in the table). It also counts the kernels the
cold step compiled, kernels compiled in warm steps (the target is none), ops that fell back and
ops run on the host (dropout's noise is drawn on the host, so seeds give torch's numbers).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # library_models lives with the tests that check it


def _wait(device: str, tensors) -> None:
    """Block until the device has produced ``tensors`` (and torch's CUDA stream is idle)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    for tensor in tensors:
        storage = getattr(tensor, "_storage", None)
        if storage is not None:
            storage.buffer.wait()


def _median_ms(run: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(name: str, size: str, device: str, torch_device: str, steps: int, tokens: int) -> dict:
    """One model's numbers (runs in a process of its own; see main)."""
    import torch

    import library_models
    import turbine

    threads = turbine.config.cpu_workers if device.startswith("turbine:cpu") else torch.get_num_threads()
    torch.set_num_threads(threads)
    reference = library_models.build(name, size).to(torch_device)
    model = copy.deepcopy(library_models.build(name, size)).to(device)
    batches = {
        device: {k: v.to(device) for k, v in library_models.batch(name, size).items()},
        torch_device: {k: v.to(torch_device) for k, v in library_models.batch(name, size).items()},
    }
    optimizers = {device: torch.optim.AdamW(model.parameters(), lr=1e-4), torch_device: torch.optim.AdamW(reference.parameters(), lr=1e-4)}
    models = {device: model, torch_device: reference}

    def step(where: str) -> Callable[[], None]:
        def run() -> None:
            optimizers[where].zero_grad()
            models[where](**batches[where]).loss.backward()
            optimizers[where].step()
            _wait(where, models[where].parameters())

        return run

    result = {"model": name, "threads": threads}
    turbine.reset_stats()
    start = time.perf_counter()
    step(device)()
    result["cold_s"] = time.perf_counter() - start
    result["cold_kernels"] = turbine.stats()["kernels_compiled"]
    start = time.perf_counter()
    step(torch_device)()
    result["torch_first_s"] = time.perf_counter() - start
    for _ in range(2):  # step 2 makes the optimizer state's kernels; both sides warm up alike
        step(device)()
        step(torch_device)()
    turbine.reset_stats()
    train = {device: [], torch_device: []}
    for _ in range(steps):
        for where in (torch_device, device):
            train[where].append(_median_ms(step(where), 1))
    stats = turbine.stats()
    result["train_ms"] = statistics.median(train[device])
    result["torch_train_ms"] = statistics.median(train[torch_device])
    result["warm_kernels"] = stats["kernels_compiled"] + stats["cache_hits_disk"]
    result["fallbacks"] = stats["fallbacks"]
    result["host_ops"] = sum(stats["host_ops"].values())

    for m in models.values():
        m.eval()

    def forward(where: str) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                logits = models[where](**batches[where]).logits
            _wait(where, [logits])

        return run

    for where in models:
        forward(where)()
    result["forward_ms"] = _median_ms(forward(device), steps)
    result["torch_forward_ms"] = _median_ms(forward(torch_device), steps)

    if library_models.MODELS[name][2]:
        prompts = {where: library_models.prompt(size, length=8).to(where) for where in models}
        options = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False, "pad_token_id": 1}

        def generate(where: str) -> Callable[[], None]:
            def run() -> None:
                out = models[where].generate(prompts[where], **options)
                _wait(where, [out])

            return run

        turbine.reset_stats()
        start = time.perf_counter()
        generate(device)()
        result["generate_cold_s"] = time.perf_counter() - start
        result["generate_cold_kernels"] = turbine.stats()["kernels_compiled"]
        generate(torch_device)()
        result["generate_ms"] = _median_ms(generate(device), max(1, steps // 3))
        result["torch_generate_ms"] = _median_ms(generate(torch_device), max(1, steps // 3))
    return result


def table(results: list[dict], size: str, device: str, torch_device: str, tokens: int) -> str:
    import library_models

    threads = results[0]["threads"] if results else "?"
    dims = library_models.SIZES[size]
    lines = [
        f"Library models ({size} size: hidden {dims['hidden']}, {dims['layers']} layers, batch {dims['batch']} x "
        f"{dims['tokens']} tokens or {dims['image']}x{dims['image']} images; MNIST: batch 64) on {device} against torch "
        f"{torch_device} ({threads} torch thread(s) = turbine's IREE CPU workers); medians, ms unless marked; "
        "ratio = turbine / torch",
        "",
        "| model | cold first step (kernels) | torch first step | warm forward: torch / turbine (ratio) | "
        f"warm train step: torch / turbine (ratio) | warm generate {tokens} tokens: torch / turbine (ratio) | "
        "kernels compiled in warm steps | fallbacks | host ops per warm step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        generate = "-"
        if "generate_ms" in r:
            generate = (
                f"{r['torch_generate_ms']:.1f} / {r['generate_ms']:.1f} ({r['generate_ms'] / r['torch_generate_ms']:.2f}); "
                f"first call {r['generate_cold_s']:.1f} s, {r['generate_cold_kernels']} kernels"
            )
        lines.append(
            f"| {r['model']} | {r['cold_s']:.1f} s ({r['cold_kernels']}) | {r['torch_first_s'] * 1e3:.0f} | "
            f"{r['torch_forward_ms']:.1f} / {r['forward_ms']:.1f} ({r['forward_ms'] / r['torch_forward_ms']:.2f}) | "
            f"{r['torch_train_ms']:.1f} / {r['train_ms']:.1f} ({r['train_ms'] / r['torch_train_ms']:.2f}) | {generate} | "
            f"{r['warm_kernels']} | {sum(r['fallbacks'].values()) or 'none'} | {r['host_ops'] / max(1, r['steps']):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="turbine:cpu")
    parser.add_argument("--torch-device", default="cpu")
    parser.add_argument("--models", nargs="*", default=["gpt2", "llama", "bert", "vit", "resnet", "mnist"])
    parser.add_argument("--size", default="bench", choices=["test", "bench"], help="model size (tests/library_models.py)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = measure(args.child, args.size, args.device, args.torch_device, args.steps, args.tokens)
        result["steps"] = args.steps
        print("RESULT " + json.dumps(result))
        return
    results = []
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="turbine-models-") as cache:
            env = {**os.environ, "TURBINE_CACHE_DIR": cache, "TURBINE_CACHE_BUNDLES": "0", "TURBINE_PROGRESS": "0"}
            command = [sys.executable, __file__, "--child", name] + sys.argv[1:]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            print(f"{name}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        results.append(json.loads(lines[-1][len("RESULT ") :]))
        print(f"{name}: done", file=sys.stderr)
    text = table(results, args.size, args.device, args.torch_device, args.tokens)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
