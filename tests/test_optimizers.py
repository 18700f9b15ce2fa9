"""Every optimizer in torch.optim, and the common learning-rate schedulers, train on a turbine
device with torch's losses, and compile nothing after their first two steps.

Numbers that change every step (learning rates, bias corrections, step counts) are runtime
inputs of the kernels (eager/schema.py), so a training loop's kernels are all compiled by the
end of step 2. The one exception is new code: RAdam runs its rectification only from step 6.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

import turbine
from checks import D

pytestmark = pytest.mark.slow  # 50 steps of every optimizer

STEPS = 50

#: How each optimizer is built for the test (options that reach more of its code); every
#: optimizer class in torch.optim must have an entry, so a new one cannot go untested.
OPTIMIZERS = {
    "Adadelta": lambda p: torch.optim.Adadelta(p, lr=0.5, weight_decay=0.01),
    "Adafactor": lambda p: torch.optim.Adafactor(p, lr=0.01),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.05, lr_decay=0.01),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    "Adamax": lambda p: torch.optim.Adamax(p, lr=0.01),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=0.05, t0=10),
    "LBFGS": lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=4, history_size=5),
    "Muon": lambda p: torch.optim.Muon(p, lr=0.01),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=0.01, decoupled_weight_decay=True, weight_decay=0.01),
    "RAdam": lambda p: torch.optim.RAdam(p, lr=0.01),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9, centered=True),
    "Rprop": lambda p: torch.optim.Rprop(p, lr=0.01),
    "SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "SparseAdam": None,  # takes sparse gradients only; turbine tensors are dense
}

#: Steps at which an optimizer first runs code it has not run before, so new kernels are right.
NEW_CODE_AT = {
    "RAdam": {6},  # rho_t > 5 from step 6 with the default betas
    "ASGD": {13},  # averaging starts once mu != 1: two steps after t0=10
}


#: (losses, parameters) tolerances wider than DEFAULT_TOLERANCE, with why. Muon rounds each
#: float32 gradient to bfloat16 before it orthogonalizes it: gradients 3e-8 apart (a matmul's
#: summation order, IREE's against torch's) round apart now and then (first at step 10 here),
#: and each update moves every direction by lr, so the two runs part by up to 1e-3 in the
#: parameters by step 50. LBFGS's line search magnifies float32 rounding. Adafactor divides
#: each bias gradient by its own running RMS, so a bias whose gradient hovers near zero follows
#: rounding: in torch's own float32 run, tanh rounded one ulp the other way moves the first bias
#: by 1.1e-5 at step 50 (IREE's tanh is within 2.3 ulp on the CPU, and how close depends on the
#: host's vector instructions).
TOLERANCE = {
    "Adafactor": ({"rtol": 1e-4, "atol": 1e-5}, {"rtol": 1e-4, "atol": 5e-5}),
    "Muon": ({"rtol": 1e-3, "atol": 1e-5}, {"rtol": 0, "atol": 3e-3}),
    "LBFGS": ({"rtol": 1e-3, "atol": 1e-4}, {"rtol": 1e-3, "atol": 1e-4}),
}
DEFAULT_TOLERANCE = ({"rtol": 1e-4, "atol": 1e-5}, {"rtol": 1e-4, "atol": 1e-5})


def _optimizer_classes() -> list[str]:
    return sorted(
        name
        for name, value in vars(torch.optim).items()
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer
    )


def test_every_optimizer_class_is_covered():
    assert sorted(OPTIMIZERS) == _optimizer_classes()


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    bias = name != "Muon"  # Muon takes 2-D parameters only
    return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=bias), torch.nn.Tanh(), torch.nn.Linear(16, 4, bias=bias))


def _data(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 8, generator=generator), torch.randn(12, 4, generator=generator)
    return x.to(device), y.to(device)


def _train(model, optimizer, x, y, scheduler=None, steps=STEPS) -> tuple[list[float], list[int]]:
    """Losses and, per step, the kernels that were not in memory (compiled or read from disk)."""
    losses, new_kernels = [], []

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        before = turbine.stats()
        loss = optimizer.step(closure)
        if scheduler is not None:
            scheduler.step(loss.item()) if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) else scheduler.step()
        losses.append(loss.item())
        after = turbine.stats()
        new_kernels.append(
            after["kernels_compiled"] - before["kernels_compiled"] + after["cache_hits_disk"] - before["cache_hits_disk"]
        )
    return losses, new_kernels


def _check(name: str, make, foreach: bool, schedule=None) -> None:
    reference_model = _model(name)
    model = copy.deepcopy(reference_model).to(D)
    options = {"foreach": True} if foreach else {}
    reference = make(reference_model.parameters())
    optimizer = make(model.parameters())
    for group in (*reference.param_groups, *optimizer.param_groups):
        group.update(options)
    with turbine.override(background_compile=False):
        expected, _ = _train(reference_model, reference, *_data("cpu"), schedule(reference) if schedule else None)
        losses, new_kernels = _train(model, optimizer, *_data(D), schedule(optimizer) if schedule else None)
    loss_tolerance, parameter_tolerance = TOLERANCE.get(name, DEFAULT_TOLERANCE)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), **loss_tolerance)
    for p, q in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **parameter_tolerance)
    late = {step: count for step, count in enumerate(new_kernels, 1) if step > 2 and count and step not in NEW_CODE_AT.get(name, ())}
    assert not late, f"{name} compiled kernels after step 2 (step: kernels): {late}"
    assert turbine.stats()["fallbacks"] == {}, f"{name} ran ops through the fallback"


def _cases() -> list:
    cases = []
    for name, make in OPTIMIZERS.items():
        if make is None:
            continue
        cases.append(pytest.param(name, False, id=f"{name}-default"))
        if "foreach" in inspect.signature(getattr(torch.optim, name).__init__).parameters:
            cases.append(pytest.param(name, True, id=f"{name}-foreach"))
    return cases


@pytest.mark.parametrize("name, foreach", _cases())
def test_optimizer_trains_like_torch_and_compiles_nothing_after_step_2(name, foreach, stats):
    _check(name, OPTIMIZERS[name], foreach)


SCHEDULES = {
    "SGD+OneCycleLR": (
        OPTIMIZERS["SGD"],
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=STEPS),  # cycles momentum too
    ),
    "Adam+CosineAnnealingLR": (OPTIMIZERS["Adam"], lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20)),
    "AdamW+warmup": (
        OPTIMIZERS["AdamW"],
        lambda o: torch.optim.lr_scheduler.SequentialLR(
            o,
            [torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=10), torch.optim.lr_scheduler.ExponentialLR(o, 0.95)],
            milestones=[10],
        ),
    ),
    "RMSprop+CyclicLR": (
        OPTIMIZERS["RMSprop"],
        lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=0.001, max_lr=0.02, step_size_up=7),
    ),
    "SGD+ReduceLROnPlateau": (
        OPTIMIZERS["SGD"],
        lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=2, threshold=0.1),
    ),
    "Adagrad+StepLR": (OPTIMIZERS["Adagrad"], lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.7)),
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_scheduled_learning_rates_compile_nothing_after_step_2(schedule, stats):
    make, scheduler = SCHEDULES[schedule]
    _check(schedule.split("+")[0], make, False, scheduler)
