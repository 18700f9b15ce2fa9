"""turbine beside torch.compile (eager/dynamo_rules.py): a model of torch's own tensors compiles
as it does without turbine, and a compiled function that meets turbine tensors runs their ops
eagerly on turbine, correctly, with one warning; dynamo compiles none of turbine's frames."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import turbine
from checks import D
from turbine.eager import dynamo_rules


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def traced_frames():
    """The frames dynamo starts to trace (function and file), from its log."""
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("torch._dynamo.symbolic_convert")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield lambda: [m for m in messages if "start tracing" in m]
    logger.removeHandler(handler)
    logger.setLevel(level)


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def test_a_model_of_torchs_own_tensors_compiles_to_one_graph():
    """turbine's function mode sees every torch call; dynamo traces its handler into the graph.
    Its set lookups had made dynamo give up on every frame: no graph, everything eager."""
    model, x = _mlp(), torch.randn(8, 16, requires_grad=True)
    explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = torch.compile(model, backend="aot_eager")
    (grad,) = torch.autograd.grad(compiled(x).square().sum(), x)
    (expected,) = torch.autograd.grad(model(x).square().sum(), x)
    torch.testing.assert_close(grad, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch CUDA")
def test_a_model_on_torch_cuda_compiles_beside_turbine():
    model, x = _mlp().cuda(), torch.randn(8, 16, device="cuda", requires_grad=True)
    explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = torch.compile(model)  # inductor's Triton kernels
    (grad,) = torch.autograd.grad(compiled(x).square().sum(), x)
    (expected,) = torch.autograd.grad(model(x).square().sum(), x)
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_inductor_compiles_a_model_of_torchs_own_tensors():
    model, x = _mlp(), torch.randn(8, 16)
    torch.testing.assert_close(torch.compile(model)(x), model(x))


def test_a_compiled_model_on_turbine_runs_eagerly_with_one_warning(monkeypatch, stats, traced_frames):
    monkeypatch.setattr(dynamo_rules, "_warned", False)
    model, x = _mlp(), torch.randn(8, 16)
    on_device = _mlp()
    on_device.load_state_dict(model.state_dict())
    on_device.to(D)
    compiled = torch.compile(on_device, backend="aot_eager")
    with pytest.warns(UserWarning, match="torch.compile does not compile ops on turbine tensors"):
        result = compiled(x.to(D))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        again = compiled(x.to(D))
    assert isinstance(result, turbine.DeviceTensor)
    torch.testing.assert_close(result.cpu(), model(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(again.cpu(), model(x), rtol=1e-4, atol=1e-5)
    again.sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(on_device[0].weight.grad.cpu(), model[0].weight.grad, rtol=1e-4, atol=1e-5)
    assert not stats()["fallbacks"]
    frames = traced_frames()
    assert frames, "dynamo's log no longer says which frames it traces"
    assert not [f for f in frames if "/turbine/" in f or "/iree/" in f], frames


def test_a_compiled_function_may_create_and_move_turbine_tensors(monkeypatch):
    """Calls that name a turbine device break dynamo's graph and run eagerly; the CPU work
    around them stays in the graph."""
    monkeypatch.setattr(dynamo_rules, "_warned", True)

    def mixed(a, b):
        moved = (b + 1).to(D) + a * 2
        return moved, torch.ones(3, device=D), torch.sin(b)

    a, b = torch.randn(3), torch.randn(3)
    moved, ones, sine = torch.compile(mixed, backend="aot_eager")(a.to(D), b)
    torch.testing.assert_close(moved.cpu(), (b + 1) + a * 2)
    torch.testing.assert_close(ones.cpu(), torch.ones(3))
    assert not isinstance(sine, turbine.DeviceTensor)
    torch.testing.assert_close(sine, torch.sin(b))


def test_other_compile_stances_and_a_non_strict_export_run_turbine_eagerly(monkeypatch):
    """Under some stances dynamo's frame callback stays on inside torch.compiler.disable; and a
    non-strict export holds torch.compiler.is_compiling for its whole run: both had looped."""
    monkeypatch.setattr(dynamo_rules, "_warned", True)
    model, x = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), torch.randn(2, 4)
    on_device = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).to(D)
    on_device.load_state_dict(model.state_dict())
    with torch.compiler.set_stance("eager_on_recompile"):
        compiled = torch.compile(on_device, backend="aot_eager")
        torch.testing.assert_close(compiled(x.to(D)).cpu(), model(x))
        torch.testing.assert_close(compiled(x[:1].to(D)).cpu(), model(x[:1]))
    exported = torch.export.export(on_device, (x.to(D),), strict=False)
    torch.testing.assert_close(exported.module()(x.to(D)).cpu(), model(x))


def test_fullgraph_errors_say_that_turbine_runs_the_call_eagerly():
    """dynamo's own errors named no turbine ("Failed to convert args/kwargs to proxy ...
    UserDefinedObjectVariable(DeviceTensor)", "Attempted to call function marked as skipped")."""
    x = torch.randn(3)
    compiled = torch.compile(lambda t: torch.relu(t) + 1, fullgraph=True, backend="eager")
    for call in (lambda: compiled(x.to(D)), lambda: torch.compile(lambda t: t + torch.ones(3, device=D), fullgraph=True, backend="eager")(x)):
        with pytest.raises(torch._dynamo.exc.Unsupported, match="turbine runs this call eagerly"):
            call()


def test_a_moved_tensor_looks_like_no_traceable_subclass_outside_module_to():
    """``Module._apply`` swaps a moved tensor into the parameter when the tensor says it is a
    traceable subclass (eager/conversion.py); a tensor moved by a user's ``.to()`` kept that mark,
    and dynamo then failed inside its own code on it, where it breaks the graph for the rest."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    assert not is_traceable_wrapper_subclass(torch.randn(3).to(D))
    norm = torch.nn.BatchNorm1d(3).to(D)  # Module._apply assigns buffers: they need no mark
    assert not is_traceable_wrapper_subclass(norm.running_mean)
    shared = torch.nn.Linear(3, 3)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared).to(D)
    assert model[0].weight is model[2].weight and isinstance(model[0].weight, turbine.DeviceTensor)
