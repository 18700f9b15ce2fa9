"""Module state moves as torch moves it: shared parameters stay shared, ``.data`` assignment and
dtype conversions keep each parameter's identity, and batch norm keeps its running statistics."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import turbine
from checks import D



class Tied(torch.nn.Module):
    """An embedding and an output layer sharing one weight, as GPT-2's and BERT's do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(ids)))


def _tied() -> Tied:
    torch.manual_seed(0)
    return Tied()


MOVES = {
    "to(device)": lambda m: m.to(D),
    "to(device).half()": lambda m: m.to(D).half(),
    "half().to(device)": lambda m: m.half().to(D),
    "to(device, bfloat16)": lambda m: m.to(D, torch.bfloat16),
    "to(device).double()": lambda m: m.to(D).double(),
    "to(device).cpu()": lambda m: m.to(D).cpu(),
    "to(device).to(cpu1)": lambda m: m.to(D).to("turbine:cpu1"),
}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_shared_parameters_stay_shared(move):
    model = _tied()
    reference = copy.deepcopy(model)
    parameter = model.embed.weight
    moved = MOVES[move](model)
    assert moved.head.weight is moved.embed.weight
    assert moved.embed.weight is parameter, "the Parameter object itself is kept, as torch keeps it"
    assert isinstance(moved.embed.weight, torch.nn.Parameter) and moved.embed.weight.is_leaf
    assert len(list(moved.parameters())) == len(list(reference.parameters()))
    dtype = moved.embed.weight.dtype
    torch.testing.assert_close(moved.embed.weight.detach().cpu(), reference.embed.weight.detach().to(dtype))


@pytest.mark.parametrize("built_on", ["cpu", "meta"])
def test_to_empty_keeps_shared_parameters_shared(built_on):
    """``module.to_empty(device=...)`` (a model built on the meta device, then given memory) keeps
    a tied weight one parameter, as ``.to()`` does; it made one for each module."""
    with torch.device(built_on):
        model = _tied()
    parameter = model.embed.weight
    model.to_empty(device=D)
    assert model.head.weight is model.embed.weight is parameter
    assert model.embed.weight.device == torch.device(D) and model.embed.weight.requires_grad
    assert len(list(model.parameters())) == 3
    torch.nn.init.normal_(model.embed.weight)
    torch.testing.assert_close(model.head.weight.cpu(), model.embed.weight.cpu())


def test_a_tied_model_trains_like_torch():
    """The shared weight's gradient sums both uses (an untied copy would get half of it)."""
    reference = _tied()
    model = copy.deepcopy(reference).to(D)
    ids = torch.randint(0, 11, (4, 5))
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in (reference, model)]
    for _ in range(3):
        for m, optimizer, x in zip((reference, model), optimizers, (ids, ids.to(D))):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
            optimizer.step()
        torch.testing.assert_close(model.embed.weight.grad.cpu(), reference.embed.weight.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model.head.weight.detach().cpu(), reference.head.weight.detach(), rtol=1e-4, atol=1e-6)


def test_gradients_move_with_their_parameters():
    model = torch.nn.Linear(3, 2)
    model(torch.randn(4, 3)).sum().backward()
    grad = model.weight.grad.clone()
    model.to(D)
    assert model.weight.grad.device == model.weight.device
    torch.testing.assert_close(model.weight.grad.cpu(), grad)
    model.cpu()
    assert model.weight.grad.device.type == "cpu"
    torch.testing.assert_close(model.weight.grad, grad)


def test_moving_a_module_whose_graph_is_alive_warns_and_still_moves():
    """swap_tensors cannot swap a parameter an autograd graph still holds: the module then gets new
    parameters (as torch gives it), and the warning says that shared ones stop being shared."""
    from turbine.eager import conversion

    conversion._warned.clear()
    model = _tied()
    output = model(torch.tensor([1, 2]))
    with pytest.warns(UserWarning, match="stop being shared"):
        model.to(D)
    assert model.embed.weight.device.type == "turbine"
    del output


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_data_assignment_takes_the_new_values(dtype):
    t = torch.tensor([1.0, 2.0, 3.0], device=D)
    identity = id(t)
    value = torch.tensor([[4, 5], [6, 7]], dtype=dtype)
    t.data = value.to(D)
    assert id(t) == identity and t.dtype == dtype and t.shape == (2, 2)
    torch.testing.assert_close(t.cpu(), value)
    t.data = torch.tensor([8.0])  # a CPU value: t becomes a CPU tensor, as a CUDA tensor would
    assert id(t) == identity and t.device.type == "cpu"
    torch.testing.assert_close(t, torch.tensor([8.0]))


def test_data_assignment_keeps_a_parameter_and_its_views_see_the_storage_it_had():
    parameter = torch.nn.Parameter(torch.zeros(3, device=D))
    old_view = parameter.data
    parameter.data = torch.ones(3, device=D)
    assert isinstance(parameter, torch.nn.Parameter) and parameter.requires_grad
    torch.testing.assert_close(parameter.detach().cpu(), torch.ones(3))
    torch.testing.assert_close(old_view.cpu(), torch.zeros(3))  # as in torch: .data = swaps storage


@pytest.mark.parametrize("convert", ["half", "bfloat16", "double"])
@pytest.mark.parametrize("order", ["convert then move", "move then convert"])
def test_dtype_conversion_in_either_order(convert, order):
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model = copy.deepcopy(reference)
    model = getattr(model, convert)().to(D) if order == "convert then move" else getattr(model.to(D), convert)()
    reference = getattr(reference, convert)()
    x = torch.randn(5, 4).to(reference[0].weight.dtype)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.dtype == q.dtype and p.device.type == "turbine"
        torch.testing.assert_close(p.detach().cpu(), q.detach())
    if convert != "half":  # torch's CPU kernels have no float16 matmul to compare with on every build
        torch.testing.assert_close(model(x.to(D)).detach().cpu(), reference(x).detach(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("norm", ["BatchNorm1d", "BatchNorm2d"])
def test_batch_norm_keeps_running_statistics_and_evaluates_without_fallback(norm, stats):
    torch.manual_seed(0)
    reference = getattr(torch.nn, norm)(4, momentum=0.3)
    model = copy.deepcopy(reference).to(D)
    shape = (8, 4) if norm == "BatchNorm1d" else (8, 4, 3, 3)
    for step in range(3):
        x = torch.randn(shape) * (step + 1) + step
        torch.testing.assert_close(model(x.to(D)).detach().cpu(), reference(x).detach())
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(model, name).cpu(), getattr(reference, name))
    model.eval(), reference.eval()
    x = torch.randn(shape, requires_grad=True)
    xd = x.detach().to(D).requires_grad_()
    expected, actual = reference(x), model(xd)
    torch.testing.assert_close(actual.detach().cpu(), expected.detach())
    expected.square().sum().backward()
    actual.square().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.weight.grad.cpu(), reference.weight.grad, rtol=1e-4, atol=1e-5)
    assert stats()["fallbacks"] == {}


def test_batch_norm_ops_write_running_statistics_as_torch():
    """Every batch norm op that updates running statistics, called directly."""
    aten = torch.ops.aten
    x, weight, bias = torch.randn(6, 3, 4), torch.randn(3), torch.randn(3)
    calls = {
        "native_batch_norm": lambda t, m, v: aten.native_batch_norm(t, weight.to(t.device), bias.to(t.device), m, v, True, 0.2, 1e-5),
        "_native_batch_norm_legit": lambda t, m, v: aten._native_batch_norm_legit(t, None, None, m, v, True, 0.2, 1e-5),
        "_batch_norm_with_update": lambda t, m, v: aten._batch_norm_with_update(t, None, None, m, v, 0.2, 1e-5),
    }
    for name, call in calls.items():
        mean, var = torch.randn(3), torch.rand(3) + 0.5
        device_mean, device_var = mean.to(D), var.to(D)
        expected = call(x, mean, var)
        actual = call(x.to(D), device_mean, device_var)
        torch.testing.assert_close(device_mean.cpu(), mean, msg=lambda m: f"{name} running_mean: {m}")
        torch.testing.assert_close(device_var.cpu(), var, msg=lambda m: f"{name} running_var: {m}")
        torch.testing.assert_close(actual[0].cpu(), expected[0], msg=lambda m: f"{name} output: {m}")


def test_eval_batch_norm_statistics_take_the_shape_rule():
    """In eval mode torch's CPU kernel returns empty saved statistics and its shape rule (and its
    CUDA kernel) [C] ones; turbine returns the rule's, and the output is torch's."""
    x, mean, var = torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error", turbine.TurbineFallbackWarning)
        out, saved_mean, saved_invstd = torch.ops.aten.native_batch_norm(x.to(D), None, None, mean.to(D), var.to(D), False, 0.1, 1e-5)
    assert saved_mean.shape == saved_invstd.shape == (3,)
    expected = torch.ops.aten.native_batch_norm(x, None, None, mean, var, False, 0.1, 1e-5)[0]
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(saved_invstd.cpu(), torch.rsqrt(var + 1e-5))


def test_native_batch_norm_legit_called_to_evaluate_gives_the_output_and_the_rules_statistics():
    """``_native_batch_norm_legit(training=False)`` failed: its functional twin's shape rule says
    [C] statistics and torch's CPU kernel, run as the fallback, gave [0]."""
    x, mean, var = torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5
    out, saved_mean, saved_invstd = torch.ops.aten._native_batch_norm_legit(x.to(D), None, None, mean.to(D), var.to(D), False, 0.1, 1e-5)
    expected = torch.ops.aten._native_batch_norm_legit(x, None, None, mean, var, False, 0.1, 1e-5)[0]
    torch.testing.assert_close(out.cpu(), expected)
    assert saved_mean.shape == saved_invstd.shape == (3,)


def test_a_lazy_modules_uninitialized_parameters_say_how_to_move_them():
    """A lazy module cannot move before its first call (its parameters have no shape yet): the
    error says so and what to do, where torch's own said a parameter was used uninitialized."""
    lazy = torch.nn.LazyLinear(4)
    with pytest.raises(RuntimeError, match="uninitialized parameter of a lazy module.*Run the module once on a CPU batch"):
        lazy.to(D)
    x = torch.randn(3, 5)
    expected = lazy(x)  # initialized on the CPU, as the message says; then it moves
    torch.testing.assert_close(lazy.to(D)(x.to(D)).cpu(), expected)


def test_the_gradient_of_batch_norm_with_update_runs_on_iree_as_torchs(stats):
    """``_batch_norm_with_update`` (what torch.export emits) has ``batch_norm_backward`` as its
    gradient, which takes the forward's empty ``reserve``: an empty argument sent it to the
    fallback."""
    torch.manual_seed(0)
    x, weight, bias, mean, var = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2) + 0.5
    leaves = [[t.clone().requires_grad_() for t in (x, weight, bias)], [t.to(D).requires_grad_() for t in (x, weight, bias)]]
    grad = torch.randn(3, 2, 4)
    for (xx, w, b), m, v, g in zip(leaves, (mean, mean.to(D)), (var, var.to(D)), (grad, grad.to(D))):
        with turbine.fallback("error"):
            torch.ops.aten._batch_norm_with_update(xx, w, b, m, v, 0.1, 1e-5)[0].backward(g)
    for torchs, ours in zip(*leaves):
        torch.testing.assert_close(ours.grad.cpu(), torchs.grad)
    assert stats()["fallbacks"] == {}
