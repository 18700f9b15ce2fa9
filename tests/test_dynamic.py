"""Shape-generic kernels (eager/dynamic.py): a dim that takes a second size becomes dynamic."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import turbine
from turbine.config import override
from turbine.eager import dynamic
from checks import D, check
from conftest import forget_memory


@pytest.fixture(autouse=True)
def _foreground():
    """Compiles counted as they happen (a dynamic kernel compiles in the foreground anyway)."""
    with override(background_compile=False, dynamic="auto"):
        yield


def mlp() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 5))
    return model, copy.deepcopy(model).to(D)


def on_device_only() -> tuple[dict, dict]:
    """Copies of the fallback and host-op counters: unchanged while every op ran on the device."""
    return dict(turbine.stats()["fallbacks"]), dict(turbine.stats()["host_ops"])


def run(model, ours, batch: int) -> None:
    """The MLP on a batch, torch's results, and no op left the device (a kernel that did not
    compile cannot hide behind the fallback)."""
    x = torch.randn(batch, 12)
    before = on_device_only()
    torch.testing.assert_close(ours(x.to(D)).cpu(), model(x), rtol=1e-4, atol=1e-5)
    assert on_device_only() == before, "an op fell back or ran on the host"


def test_after_a_second_batch_size_new_sizes_compile_nothing(fresh_cache, stats):
    model, ours = mlp()
    for batch in (6, 9):
        run(model, ours, batch)
    compiled = stats()["kernels_compiled"]
    for batch in (2, 17, 4, 31):
        run(model, ours, batch)
    assert stats()["kernels_compiled"] == compiled, "a new batch size compiled a kernel"


def test_size_one_runs_on_the_dynamic_kernel_and_size_zero_on_its_own(fresh_cache, stats):
    """Once batch is dynamic, batch 1 compiles nothing (its program is the dynamic one's at 1);
    an empty batch is right too."""
    model, ours = mlp()
    for batch in (6, 9):
        run(model, ours, batch)
    compiled = stats()["kernels_compiled"]
    for batch in (1, 0, 1, 5):
        run(model, ours, batch)
    assert stats()["kernels_compiled"] == compiled, "batch 1 compiled a kernel of its own"


W = torch.randn(6, 4)

#: (name, function, input shapes with None at the dim that changes, whether a size-1 call runs
#: on the dynamic kernel). squeeze_copy's result loses the dim at size 1: another program.
SIZE_ONE_CASES = [
    ("relu", lambda x: torch.relu(x), [(None, 4)], True),
    ("linear", lambda x: torch.nn.functional.linear(x, W.to(x.device), W[:, 0].to(x.device)), [(None, 4)], True),
    ("sum over it", lambda x: x.sum(0), [(None, 4)], True),
    ("softmax over it", lambda x: x.softmax(0), [(None, 4)], True),
    ("softmax along it", lambda x: x.softmax(-1), [(None, 4)], True),
    ("layer_norm", lambda x: torch.nn.functional.layer_norm(x, [4]), [(None, 4)], True),
    ("cumsum over it", lambda x: x.cumsum(0), [(None, 4)], True),
    ("max over it", lambda x: x.max(0).values, [(None, 4)], True),
    ("argmax over it", lambda x: x.argmax(0), [(None, 4)], True),
    ("mean of the other dim", lambda x: x.mean(1), [(4, None)], True),
    ("add, both sides", lambda x, y: x + y, [(None, 4), (None, 4)], True),
    ("mul by a scalar", lambda x: x * 3.5, [(4, None)], True),
    ("cat", lambda x, y: torch.cat([x, y]), [(None, 4), (None, 4)], True),
    ("mm, outer dims", lambda x, y: x @ y, [(None, 4), (4, None)], True),
    ("bmm, outer dims", lambda x, y: torch.bmm(x, y), [(2, None, 4), (2, 4, None)], True),
    ("where", lambda x, y: torch.where(x > 0, x, y), [(None, 4), (None, 4)], True),
    ("squeeze_copy", lambda x: torch.squeeze_copy(x, 0), [(None, 4)], False),
]


@pytest.mark.parametrize("name, fn, shapes, served", SIZE_ONE_CASES, ids=[case[0] for case in SIZE_ONE_CASES])
def test_size_one_at_a_dynamic_dim_gives_torchs_results(name, fn, shapes, served, fresh_cache, stats):
    """A call with a 1 where the family's kernel is dynamic runs on that kernel only where its
    trace at 1 is the dynamic trace's (kernels_cache/program_match.py); either way, torch's results."""
    def call(n: int) -> None:
        inputs = [torch.randn(*[n if size is None else size for size in shape]) for shape in shapes]
        check(fn, *inputs)

    for n in (5, 7):
        call(n)
    # Where IREE cannot compile the family's dynamic kernel for the target (argmax on cuda, IREE
    # 3.13: "expected type to be 'tensor<?x1xf32>'"), every size has its own kernel, 1 and 3 too.
    refused = any("'s" in failure["op"] for failure in fresh_cache.failures())
    compiled = stats()["kernels_compiled"]
    call(1)
    assert (stats()["kernels_compiled"] == compiled) == (served and not refused), "size 1 ran on the wrong kernel"
    compiled = stats()["kernels_compiled"]
    call(1)
    call(3)
    assert stats()["kernels_compiled"] == compiled + refused


@pytest.mark.parametrize("reduce", [lambda t: t.sum(-1), lambda t: torch.nn.functional.mse_loss(t, torch.zeros_like(t))], ids=["sum", "mse_loss"])
def test_a_large_reduction_gets_its_own_kernel_and_adds_in_float64(reduce, fresh_cache, stats):
    """A dynamic kernel's reductions over a dynamic dim add as small ones (in float32): a call
    that adds many numbers gets a kernel of its own, which adds them in float64
    (eager/decompositions/accumulation.py). Served by the kernel, a row sum of 333333 numbers near
    100 came out 2.5e-3 off (torch 5e-8). Small sizes still run on the dynamic kernel."""
    for n in (5, 7, 9):
        check(reduce, torch.rand(3, n) + 100)
    compiled = stats()["kernels_compiled"]
    x = torch.rand(3, 250_000) + 100
    torch.testing.assert_close(reduce(x.to(D)).cpu().double(), reduce(x.double()), rtol=2e-7, atol=0)
    assert stats()["kernels_compiled"] == compiled + 1, "the large size ran on the dynamic kernel"
    for n in (11, 300):
        check(reduce, torch.rand(3, n) + 100)
    assert stats()["kernels_compiled"] == compiled + 1, "a small size did not run on the dynamic kernel"


def test_a_size_one_answer_is_asked_again_of_a_new_dynamic_kernel(fresh_cache, stats):
    """squeeze_copy(x, 1) at (1, 1) runs on the kernel with dim 0 dynamic (its dim 1 stays 1).
    Once dim 1 is dynamic too, a process that builds the call's plan again asks again, of the
    new kernel, which would not squeeze: (1, 1) then gets a kernel of its own."""
    squeeze = lambda x: torch.squeeze_copy(x, 1)  # noqa: E731
    for shape in [(3, 1), (5, 1)]:
        check(squeeze, torch.randn(shape))
    compiled = stats()["kernels_compiled"]
    check(squeeze, torch.randn(1, 1))
    assert stats()["kernels_compiled"] == compiled, "(1, 1) did not run on the kernel with dim 0 dynamic"
    check(squeeze, torch.randn(5, 7))  # dim 1 dynamic: a new kernel
    forget_memory()  # plans, kernels and families: a new process, which reads them from disk
    turbine.reset_stats()
    check(squeeze, torch.randn(1, 1))
    assert stats()["kernels_compiled"] == 1, "(1, 1) ran on a kernel whose program at 1 differs"


def test_a_broadcast_one_then_a_size_does_not_stop_a_family_learning(fresh_cache, stats):
    """x's rows are 1 (a broadcast), then 5: that dim alone cannot be dynamic (the trace needs it
    equal to y's 5), so it is dropped rather than the family refused; from 7 on, both sides'
    rows share one symbol and new sizes compile nothing."""
    for rows_x, rows_y in [(1, 5), (5, 5), (7, 7), (9, 9), (11, 11)]:
        if (rows_x, rows_y) == (9, 9):
            compiled = stats()["kernels_compiled"]
        check(lambda a, b: a + b, torch.randn(rows_x, 4), torch.randn(rows_y, 4))
    assert stats()["kernels_compiled"] == compiled
    families = [f for key, f in turbine.eager.runtime.state.families.items() if "aten.add.Tensor" in str(key)]
    assert families and not families[0].refused


def test_size_one_trains_on_the_dynamic_kernels(fresh_cache, stats):
    """Forward and backward ops (addmm, mm, sum, gelu's backward) at batch 1 after batches 6 and
    9: the gradients torch gives, and nothing compiled for batch 1."""
    model, ours = mlp()

    def step(batch: int) -> None:
        x = torch.randn(batch, 12)
        model.zero_grad()
        ours.zero_grad()
        model(x).square().sum().backward()
        ours(x.to(D)).square().sum().backward()
        for theirs, mine in zip(model.parameters(), ours.parameters()):
            torch.testing.assert_close(mine.grad.cpu(), theirs.grad, rtol=1e-4, atol=1e-5)

    for batch in (6, 9):
        step(batch)
    compiled, before = stats()["kernels_compiled"], on_device_only()
    step(1)
    assert stats()["kernels_compiled"] == compiled
    assert on_device_only() == before, "an op of batch 1 fell back or ran on the host"


def test_off_compiles_a_kernel_per_size(fresh_cache, stats):
    model, ours = mlp()
    with override(dynamic="off"):
        for batch in (6, 9):
            run(model, ours, batch)
        compiled = stats()["kernels_compiled"]
        run(model, ours, 13)
        assert stats()["kernels_compiled"] > compiled


def test_all_makes_every_dim_dynamic_from_the_first_call(fresh_cache, stats):
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    with override(dynamic="all"):
        torch.testing.assert_close((a.to(D) * b.to(D)).cpu(), a * b)
        compiled = stats()["kernels_compiled"]
        c, d = torch.randn(8, 3), torch.randn(8, 3)
        torch.testing.assert_close((c.to(D) * d.to(D)).cpu(), c * d)
    assert stats()["kernels_compiled"] == compiled


@pytest.mark.parametrize("setting", ["auto", "off"])
def test_mark_dynamic_makes_a_dim_dynamic_from_the_first_call(setting, fresh_cache, stats):
    turbine.config.dynamic = setting  # restored by the autouse fixture
    x = turbine.mark_dynamic(torch.randn(6, 4).to(D), 0)
    torch.testing.assert_close(torch.tanh(x).cpu(), torch.tanh(x.cpu()))
    compiled = stats()["kernels_compiled"]
    y = turbine.mark_dynamic(torch.randn(11, 4).to(D), [0])
    torch.testing.assert_close(torch.tanh(y).cpu(), torch.tanh(y.cpu()))
    assert stats()["kernels_compiled"] == compiled
    with pytest.raises(IndexError, match="dim 2 is out of range for a tensor of 2 dims"):
        turbine.mark_dynamic(x, 2)
    with pytest.raises(TypeError, match="takes a turbine tensor"):
        turbine.mark_dynamic(torch.ones(2), 0)


def test_a_new_process_compiles_nothing_for_sizes_it_has_not_seen(fresh_cache, stats):
    model, ours = mlp()
    for batch in (6, 9):
        run(model, ours, batch)
    run(model, ours, 1)
    forget_memory()  # kernels, plans, families and choices: what a new process starts without
    turbine.reset_stats()
    for batch in (23, 1):
        run(model, ours, batch)
    assert stats()["kernels_compiled"] == 0


def test_a_lowering_that_branches_on_a_size_stays_static(fresh_cache, stats, monkeypatch):
    """A traced lowering that depends on a dynamic size could not serve other sizes: refused."""
    from turbine.eager import registry

    def branches(x):  # a 'correction' whose trace branches on the size
        return x * 2 if x.shape[0] > 7 else x * 3

    monkeypatch.setitem(registry._entries, torch.ops.aten.sinh.default, registry.OpEntry(torch.ops.aten.sinh.default))
    registry._entries[torch.ops.aten.sinh.default].correction = branches
    small, large = torch.randn(5, 3), torch.randn(9, 3)
    assert torch.equal(torch.sinh(small.to(D)).cpu(), small * 3)
    assert torch.equal(torch.sinh(large.to(D)).cpu(), large * 2)  # static: its own kernel
    other = torch.randn(12, 3)
    assert torch.equal(torch.sinh(other.to(D)).cpu(), other * 2)
    families = [f for key, f in turbine.eager.runtime.state.families.items() if "sinh" in str(key)]
    assert families and families[0].refused


def test_a_bad_setting_says_which_values_it_takes():
    with override(dynamic="sometimes"):
        with pytest.raises(ValueError, match="TURBINE_DYNAMIC .* choose one of auto, off, all"):
            dynamic.mode()


def test_a_view_at_a_new_offset_reuses_the_kernel(fresh_cache):
    """Kernels take their inputs dense, so a slice at another offset (``logits[:, -1]`` as a
    sequence grows) is the same kernel signature."""
    x = torch.randn(5, 9)
    xd = x.to(D)
    for column in range(4):
        torch.testing.assert_close(torch.sinh(xd[column]).cpu(), torch.sinh(x[column]))
    assert sum("aten.sinh" in entry["op"] for entry in fresh_cache.entries()) == 1


def test_a_dim_first_seen_as_one_becomes_dynamic_at_the_next_size(fresh_cache, stats):
    """Batch 1 then batch 6: the dim changed, so 6 compiles the dynamic kernel, and every later
    size (1 included) runs on it: two kernels per op call in all (the MLP's two Linear layers
    are one addmm family)."""
    model, ours = mlp()
    for batch in (1, 6):
        run(model, ours, batch)
    compiled = stats()["kernels_compiled"]
    for batch in (9, 14, 1, 2):
        run(model, ours, batch)
    assert stats()["kernels_compiled"] == compiled
    ops = [entry["op"].split("(")[0] for entry in fresh_cache.entries()]
    assert ops.count("aten.gelu.default") == 2 and ops.count("aten.addmm.default") <= 4


def _executed(stats) -> int:
    return stats()["kernels_compiled"]


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t[:, 1:-1, ::2],
        lambda t: t.transpose(0, 2)[1:],
        lambda t: t[:, -1],
        lambda t: t.permute(2, 0, 1)[::3, :, 1:2],
    ],
)
def test_views_of_new_sizes_gather_and_write_with_one_kernel(view, fresh_cache, stats):
    """Slices, transposes and steps of a growing tensor: after a second geometry, one gather
    kernel and one scatter kernel per rank and dtype serve every later one."""

    def check(length: int) -> None:
        base = torch.randn(3, length, 6)
        ours = base.to(D)
        torch.testing.assert_close(view(ours).cpu(), view(base))
        view(base).mul_(-1)
        view(ours).mul_(-1)  # a write through the view: the scatter
        torch.testing.assert_close(ours.cpu(), base)

    for length in (5, 8):
        check(length)
    compiled = _executed(stats)
    for length in (11, 4, 2, 17):
        check(length)
    assert _executed(stats) == compiled, "a view of new sizes compiled a kernel"


def test_factories_of_new_sizes_compile_one_kernel(fresh_cache, stats):
    for n in (3, 5):
        torch.testing.assert_close(torch.full((n, n + 1), -2.5, device=D).cpu(), torch.full((n, n + 1), -2.5))
        torch.testing.assert_close(torch.zeros(n, n + 1, device=D).cpu(), torch.zeros(n, n + 1))
        assert torch.equal(torch.arange(n, 3 * n, 2, device=D).cpu(), torch.arange(n, 3 * n, 2))
    compiled = _executed(stats)
    for n in (7, 2, 12, 1):
        torch.testing.assert_close(torch.full((n, n + 1), 0.25, device=D).cpu(), torch.full((n, n + 1), 0.25))
        torch.testing.assert_close(torch.zeros(n, n + 1, device=D).cpu(), torch.zeros(n, n + 1))
        torch.testing.assert_close(torch.ones(n, n + 1, device=D).cpu(), torch.ones(n, n + 1))
        result = torch.arange(n, 3 * n, 2, device=D).cpu()
        assert result.dtype == torch.int64 and torch.equal(result, torch.arange(n, 3 * n, 2))
    assert _executed(stats) == compiled, "a factory compiled a kernel for a new size"


def test_float_ranges_and_bool_fills_stay_per_size_and_correct(fresh_cache):
    for n in (3, 6, 4):
        torch.testing.assert_close(torch.arange(0.5, n, 0.7, device=D).cpu(), torch.arange(0.5, n, 0.7))
        assert torch.equal(torch.full((n,), True, device=D).cpu(), torch.full((n,), True))


def test_dims_equal_by_chance_get_no_new_kernel(fresh_cache, stats):
    """Attention's q @ k^T and attn @ v are one bmm family: when the sequence length reaches the
    head size, the two are equal by chance, not by the op's rule, so no kernel is compiled."""
    heads = 8

    def attention(q, k, v):
        return torch.bmm(torch.bmm(q, k.transpose(1, 2)).softmax(-1), v)

    for length in (5, 6):
        q, k, v = (torch.randn(2, length, heads) for _ in range(3))
        torch.testing.assert_close(attention(*(t.to(D) for t in (q, k, v))).cpu(), attention(q, k, v))
    compiled = _executed(stats)
    for length in (heads, 11, heads, 3):
        q, k, v = (torch.randn(2, length, heads) for _ in range(3))
        torch.testing.assert_close(attention(*(t.to(D) for t in (q, k, v))).cpu(), attention(q, k, v))
    assert _executed(stats) == compiled


def test_a_new_process_gathers_and_fills_new_sizes_with_the_kept_kernels(fresh_cache, stats):
    for n in (4, 7):
        base = torch.randn(n, 5)
        torch.testing.assert_close(base.to(D)[:, 1:].cpu(), base[:, 1:])
        torch.testing.assert_close(torch.full((n, 2), 1.5, device=D).cpu(), torch.full((n, 2), 1.5))
    forget_memory()
    turbine.reset_stats()
    base = torch.randn(9, 5)
    torch.testing.assert_close(base.to(D)[:, 1:].cpu(), base[:, 1:])
    torch.testing.assert_close(torch.full((9, 2), 1.5, device=D).cpu(), torch.full((9, 2), 1.5))
    assert stats()["kernels_compiled"] == 0


def test_cache_list_shows_what_each_family_learnt(fresh_cache, capsys):
    from turbine.__main__ import main

    for n in (4, 7):
        base = torch.randn(n, 5)
        torch.testing.assert_close(torch.tanh(base.to(D)[:, 1:]).cpu(), torch.tanh(base[:, 1:]))
    assert main(["cache", "list", "--dir", str(fresh_cache.root)]) == 0
    listing = capsys.readouterr().out
    assert "aten.tanh.default: dynamic: input 0 dim 0" in listing
    assert "turbine.gather: one kernel for any size" in listing
    torch.testing.assert_close(torch.tanh(torch.ones(1, 4).to(D)).cpu(), torch.tanh(torch.ones(1, 4)))
    assert main(["cache", "list", "--dir", str(fresh_cache.root)]) == 0
    assert "aten.tanh.default(float32[1, 4]): runs on the dynamic kernel" in capsys.readouterr().out


PROCESS = """
import copy, json, sys, torch, turbine
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 5))
ours = copy.deepcopy(model).to("turbine:cpu")
with turbine.override(background_compile=False):
    for n in map(int, sys.argv[1:]):
        x = torch.randn(n, 12)
        torch.testing.assert_close(ours(x.to("turbine:cpu")).cpu(), model(x), rtol=1e-4, atol=1e-5)
        base = torch.randn(n, 7)
        torch.testing.assert_close(base.to("turbine:cpu")[:, 2:].cpu(), base[:, 2:])
        torch.testing.assert_close(torch.full((n, 3), 0.5, device="turbine:cpu").cpu(), torch.full((n, 3), 0.5))
print(json.dumps(turbine.stats()))
"""


def _process(cache_dir, *sizes: int) -> dict:
    environment = dict(
        os.environ, TURBINE_CACHE_DIR=str(cache_dir), TURBINE_CACHE_PLANS="1", TURBINE_CACHE_BUNDLES="1",
        TURBINE_BUNDLE_MIN_KERNELS="3", TURBINE_DYNAMIC="auto",
    )
    command = [sys.executable, "-c", PROCESS, *map(str, sizes)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # new processes
def test_plans_and_bundles_hold_dynamic_kernels_for_the_next_process(tmp_path):
    """A process that saw two batch sizes leaves its dynamic kernels, families, plans and bundle;
    the next runs those sizes from saved plans and new sizes with no compile at all."""
    from turbine.kernels_cache import bundles

    first = _process(tmp_path, 6, 9)
    assert first["kernels_compiled"] > 0
    assert bundles.wait_for_builders(tmp_path, timeout=300)
    assert list(tmp_path.glob("kernels/*/*.bundle")), "no bundle was built"
    second = _process(tmp_path, 6, 9, 23, 2, 41, 1)
    assert second["kernels_compiled"] == 0
    assert second["plans_from_disk"] > 0 and second["bundles_loaded"] == 1


def test_broadcasting_calls_of_a_dynamic_family_stay_correct(fresh_cache):
    """Once add's rows are dynamic (and must be equal on both sides), calls that broadcast a 1
    against them get kernels of their own, with torch's results."""
    for a_shape, b_shape in [((5, 4), (5, 4)), ((7, 4), (7, 4)), ((6, 4), (1, 4)), ((1, 4), (9, 4)), ((3, 1), (3, 4)), ((8, 4), (8, 4))]:
        a, b = torch.randn(a_shape), torch.randn(b_shape)
        torch.testing.assert_close((a.to(D) + b.to(D)).cpu(), a + b)
