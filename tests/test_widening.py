"""Reductions that widen their input, read through a gather (eager/decompositions/widening.py):
the lowering tried where a kernel as traced does not compile, which IREE 3.13's CUDA target
needs for counts, integer sums, variances and the float64-accumulated float32 sums."""

import pytest
import torch

import turbine
from checks import check
from turbine.eager import lowering, registry, traced_call
from turbine.eager.decompositions import widening
from turbine.kernels_cache import Target, compile_mlir

aten = torch.ops.aten

CASES = {
    "count of booleans": (lambda t: t.sum(1), torch.rand(6, 96) > 0.5),
    "sum of int32": (lambda t: t.sum(), torch.randint(-(2**31), 2**31 - 1, (6, 96), dtype=torch.int32)),
    "sum as float64": (lambda t: t.sum(-1, dtype=torch.float64), torch.randn(6, 96)),
    "sum over every dim, kept": (lambda t: torch.sum(t, [0, 1], keepdim=True), torch.randint(0, 9, (6, 96), dtype=torch.int8)),
    "product of int32": (lambda t: t.prod(1), torch.randint(-3, 4, (6, 96), dtype=torch.int32)),
    "product of all": (lambda t: t.prod(), torch.tensor([-1, 1, 1, 2] * 144, dtype=torch.int16)[torch.randperm(576)].reshape(6, 96)),
    "maximum": (lambda t: t.amax(-1), torch.randint(-100, 100, (6, 96), dtype=torch.int32)),
    "nansum": (lambda t: t.nansum(1), torch.where(torch.rand(6, 96) > 0.9, float("nan"), torch.randn(6, 96))),
    "logsumexp": (lambda t: t.logsumexp(1), torch.randn(6, 96) * 10),
    "mse_loss": (lambda t: torch.nn.functional.mse_loss(t[:3], t[3:]), torch.randn(6, 96)),  # views: no other kernel
    "count_nonzero": (lambda t: torch.count_nonzero(t, 1), torch.randn(6, 96).round()),
    "count_nonzero of all": (lambda t: torch.count_nonzero(t), torch.randn(6, 96).round()),
    "variance": (lambda t: t.var(1), torch.randn(6, 96)),
    "standard deviation": (lambda t: t.std(-1, correction=0, keepdim=True), torch.randn(6, 96)),
    "variance and mean": (lambda t: torch.var_mean(t, 1), torch.randn(6, 96)),
    "std and mean": (lambda t: torch.std_mean(t, [0, 1]), torch.randn(6, 96)),
    "mean": (lambda t: t.mean(1), torch.randn(6, 96)),
    "norm": (lambda t: torch.linalg.vector_norm(t, 3, dim=1), torch.randn(6, 96)),
    "group norm": (lambda t: torch.nn.functional.group_norm(t, 2), torch.randn(2, 8, 4, 4)),
    "group norm with weights, half, channels-last": (
        lambda t: torch.nn.functional.group_norm(t, 4, t[0, :, 0, 0], t[1, :, 1, 1]),
        torch.randn(2, 8, 4, 4, dtype=torch.float16).contiguous(memory_format=torch.channels_last),
    ),
}


@pytest.mark.parametrize("name", ["count of booleans", "sum of int32", "count_nonzero", "variance", "standard deviation", "variance and mean"])
def test_reductions_at_sizes_the_cuda_target_refused_run_on_iree(name):
    """On the test device as it is (on turbine:cuda0 through gathers), with no fallback: rows of
    4096, a multiple of 32, which IREE 3.13's CUDA target did not compile as traced."""
    fn, x = CASES[name]
    x = x.repeat(1, 43)[:, :4096]
    with turbine.fallback("error"):
        check(fn, x)


@pytest.fixture
def as_traced_fails(monkeypatch, fresh_cache):
    """Every lowering but the one through gathers fails to compile, as on IREE's CUDA target; the
    CPU is offered that lowering too."""
    monkeypatch.setattr(traced_call, "GATHERED_ON", ("cpu", *traced_call.GATHERED_ON))

    def failing(*args, **kwargs):
        raise turbine.CompileError("as traced: failed to distribute (simulated)")

    monkeypatch.setattr(lowering, "lower", failing)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reductions_through_gathers_match_torch(name, as_traced_fails):
    """The kernel compiled from the rewrite runs on IREE and gives torch's results and dtypes."""
    fn, x = CASES[name]
    with turbine.fallback("error"):
        check(fn, x)


def test_a_kernel_without_such_reductions_is_not_compiled_twice(as_traced_fails):
    """Where nothing was rewritten the alternative is the kernel as traced: it is refused, so the
    op goes to the fallback policy."""
    with pytest.raises(turbine.UnsupportedOpError) as refused:
        with turbine.fallback("error"):
            (torch.randn(5).to("turbine:cpu") + 1).cpu()
    assert "no reduction over an innermost dim to read through a gather" in str(refused.value.__cause__)
    table, rewrote = widening.lowering_table()
    assert table[aten.sum.dim_IntList](torch.randn(4, 5), [0]) is NotImplemented  # not the innermost dim
    assert not rewrote()


def test_widening_reductions_compile_for_cuda():
    """IREE 3.13's CUDA target failed to distribute each of these as traced; through gathers
    they compile (for the CUDA target, which needs no GPU). The softmax and layer norm are
    turbine's corrections, which add in float64."""
    cuda = Target("cuda", "sm_80", ())
    cases = [
        (lambda t: [t.sum(1)], ((8, 64), torch.bool)),
        (lambda t: [t.sum()], ((8, 64), torch.int32)),
        (lambda t: [t.var(1)], ((8, 64), torch.float32)),
        (lambda t: [registry.correction(aten._softmax.default)(t, 1, False)], ((64, 4096), torch.float32)),
        (lambda t: list(registry.correction(aten.native_layer_norm.default)(t, [4096], None, None, 1e-5)), ((64, 4096), torch.float32)),
    ]
    for fn, inputs in cases:
        with pytest.raises(turbine.CompileError, match="failed to distribute"):
            compile_mlir(lowering.lower(fn, [inputs]), cuda)
        assert len(compile_mlir(lowering.lower_through_gathers(fn, [inputs]), cuda)) > 0


def test_group_norm_compiles_for_cuda_through_its_groups_variances():
    """IREE 3.13's CUDA target failed to distribute torch-mlir's group norm (and torch's
    decomposition of it) where a group's size is a multiple of 32: GroupNorm(2, 8) of 4x4 images
    fell back on the GPU. turbine's decomposition (decompositions/normalization.py) takes each
    group's var_mean, which reads through a gather."""
    cuda = Target("cuda", "sm_80", ())

    def group_norm(t, w, b):
        return list(aten.native_group_norm.default(t, w, b, 2, 8, 16, 2, 1e-5))

    inputs = [((2, 8, 4, 4), torch.float32), ((8,), torch.float32), ((8,), torch.float32)]
    for lowered in (lambda: lowering.lower(group_norm, inputs), lambda: lowering.lower(group_norm, inputs, decompose=True)):
        with pytest.raises(turbine.CompileError, match="failed to distribute"):
            compile_mlir(lowered(), cuda)
    assert len(compile_mlir(lowering.lower_through_gathers(group_norm, inputs), cuda)) > 0
