"""Shape-generic kernels (issue 18): what new sizes compile, and what a dynamic kernel costs.

    python benchmarks/shapes.py [--device turbine:cpu] [--tokens 8 64] [--repeats 200]

Each part starts on an empty kernel cache (a temporary directory), so every count is a cold start:

- an MLP (12-24-5) fed batch sizes 1 to 64 in random order: kernels compiled in all, and per op;
- a small decoder-only transformer (an ``nn.TransformerEncoderLayer`` with a causal mask, an
  embedding and a head) generating tokens one at a time: kernels compiled for each count of tokens;
- the per-op time of a dynamic kernel against the static one for the same size, with torch's.

Compile counts come from ``turbine.stats()``; times are medians of ``--repeats`` calls after a
warm-up, taken in the same run as torch's.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import random
import statistics
import tempfile
import time

os.environ.setdefault("TURBINE_CACHE_DIR", tempfile.mkdtemp(prefix="turbine-shapes-"))
os.environ.setdefault("TURBINE_CACHE_BUNDLES", "0")
os.environ.setdefault("TURBINE_CACHE_PLANS", "0")

import torch  # noqa: E402

import turbine  # noqa: E402
from turbine.config import override  # noqa: E402
from turbine.eager import dispatch, runtime  # noqa: E402
from turbine.kernels_cache import DiskStore, kernel_cache  # noqa: E402
from turbine.kernels_cache import cache as kernel_cache_module  # noqa: E402


def cold() -> None:
    """Start as a new process on an empty cache would: no kernels, plans or families anywhere."""
    kernel_cache.store = DiskStore(tempfile.mkdtemp(prefix="turbine-shapes-"), 2**30)
    kernel_cache.clear_memory()
    dispatch.clear_plans()
    runtime.state.families.clear()


_compile = kernel_cache_module.KernelCache._compile


def compiled_ops() -> collections.Counter:
    """Counts compiles per op name from here on (the kernel cache's compile step, observed)."""
    counts: collections.Counter = collections.Counter()

    def counting(self, key, target, lower, describe, metadata):
        counts[describe.split("(")[0]] += 1
        return _compile(self, key, target, lower, describe, metadata)

    kernel_cache_module.KernelCache._compile = counting
    return counts


def mlp_batches(device: str) -> list[str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 5))
    ours = copy.deepcopy(model).to(device)
    sizes = list(range(1, 65))
    random.Random(0).shuffle(sizes)
    cold()
    counts = compiled_ops()
    turbine.reset_stats()
    for batch in sizes:
        x = torch.randn(batch, 12)
        torch.testing.assert_close(ours(x.to(device)).cpu(), model(x), rtol=1e-4, atol=1e-5)
    per_op = ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))
    return [f"| MLP, batch sizes 1-64 in random order | {turbine.stats()['kernels_compiled']} | {per_op} |"]


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(32, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.head(self.layer(self.embed(ids), src_mask=mask, is_causal=True))


def generate(model: torch.nn.Module, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    for _ in range(tokens):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


def decoder_tokens(device: str, token_counts: list[int]) -> list[str]:
    torch.manual_seed(0)
    model = Decoder().eval()
    ours = copy.deepcopy(model).to(device)
    prompt = torch.randint(0, 50, (1, 4))
    lines = []
    for tokens in token_counts:
        cold()
        counts = compiled_ops()
        turbine.reset_stats()
        start = time.perf_counter()
        with torch.no_grad():
            assert torch.equal(generate(ours, prompt.to(device), tokens).cpu(), generate(model, prompt, tokens))
        seconds = time.perf_counter() - start
        top = ", ".join(f"{op} {n}" for op, n in counts.most_common(4))
        lines.append(f"| decoder, {tokens} tokens one at a time (prompt 4) | {turbine.stats()['kernels_compiled']} | {seconds:.1f} s; most: {top} |")
    return lines


def per_op(device: str, repeats: int) -> list[str]:
    """tanh of a 64x256 tensor: a static kernel, a dynamic one (dim 0), and torch; one call
    waited for, and a chain of 20 calls waited for at its end (where a dynamic kernel's wait
    for its inputs on the host shows)."""
    x = torch.randn(64, 256)
    ours = x.to(device)
    marked = turbine.mark_dynamic(x.to(device), 0)

    def median(fn) -> float:
        for _ in range(10):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    def chain(t: torch.Tensor) -> torch.Tensor:
        for _ in range(20):
            is_marked = bool(getattr(t, "_dynamic_dims", None))  # results do not inherit the mark
            t = turbine.mark_dynamic(torch.tanh(t), 0) if is_marked else torch.tanh(t)
        return t

    wait = lambda t: t._storage.buffer.wait()  # noqa: E731
    static = median(lambda: wait(torch.tanh(ours)))
    dynamic = median(lambda: wait(torch.tanh(marked)))
    reference = median(lambda: torch.tanh(x))
    static_chain = median(lambda: wait(chain(ours))) / 20
    dynamic_chain = median(lambda: wait(chain(marked))) / 20
    reference_chain = median(lambda: chain(x)) / 20
    return [
        f"| tanh 64x256, static kernel | {static:.1f} us | torch {reference:.1f} us |",
        f"| tanh 64x256, dynamic kernel (dim 0) | {dynamic:.1f} us | {dynamic / static:.2f} x the static kernel |",
        f"| tanh 64x256 x 20 chained, static, per op | {static_chain:.1f} us | torch {reference_chain:.1f} us |",
        f"| tanh 64x256 x 20 chained, dynamic, per op | {dynamic_chain:.1f} us | {dynamic_chain / static_chain:.2f} x the static kernel |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="turbine:cpu")
    parser.add_argument("--tokens", type=int, nargs="*", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    print(f"turbine {args.device}, torch {torch.__version__}, TURBINE_DYNAMIC={turbine.config.dynamic}")
    print("\n| workload | kernels compiled | detail |\n|---|---|---|")
    with override(background_compile=False):
        for line in mlp_batches(args.device) + decoder_tokens(args.device, args.tokens) + per_op(args.device, args.repeats):
            print(line, flush=True)


if __name__ == "__main__":
    main()
