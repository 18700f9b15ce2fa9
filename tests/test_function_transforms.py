"""torch.func's transforms and forward-mode AD over turbine tensors: each matches torch on the
CPU with IREE's kernels alone. Forward-mode AD asks ``is_same_size`` and
``_has_same_storage_numel`` of every tangent, and makes a view's tangent with
``_new_zeros_with_same_feature_meta``; all three fell back. Inside ``jvp`` and ``jacrev``, moving
a CPU tensor to the device failed ("Cannot access data pointer"): torch.func wraps the results
of ops on plain tensors there too."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad

from checks import D, check


@pytest.fixture
def weight():
    return torch.randn(16, 4)


def _layer(weight):
    return lambda x: torch.tanh(x @ weight)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: torch.func.jacrev(f)(x[0]),
        lambda f, x: torch.func.jacfwd(f)(x[0]),
        lambda f, x: torch.func.jvp(f, (x,), (torch.ones_like(x),))[1],
        lambda f, x: torch.func.vmap(f)(x),
        lambda f, x: torch.func.hessian(lambda v: f(v).sum())(x[0]),
        lambda f, x: torch.func.vmap(torch.func.grad(lambda v: f(v).square().sum()))(x),
    ],
    ids=["jacrev", "jacfwd", "jvp", "vmap", "hessian", "per-sample-grad"],
)
def test_transforms_match_the_cpu_on_iree(transform, weight):
    check(lambda x, w: transform(_layer(w), x), torch.randn(8, 16), weight, rtol=1e-4, atol=1e-5)


def test_a_cpu_tensor_moved_inside_a_transform(weight):
    x = torch.randn(16)
    for transform in (
        lambda f, x: torch.func.jvp(f, (x,), (torch.ones_like(x),))[1],
        lambda f, x: torch.func.jacrev(f)(x),
    ):
        on_device = transform(lambda v: torch.tanh(v @ weight.to(D)), x.to(D))
        torch.testing.assert_close(on_device.cpu(), transform(_layer(weight), x), rtol=1e-4, atol=1e-5)


def test_forward_mode_ad_through_views():
    """A dual tensor made of a view gets its tangent laid out as the view is."""

    def tangent(x):
        with forward_ad.dual_level():
            view = x.t()[1:5]
            dual = forward_ad.make_dual(view, torch.ones_like(view))
            return forward_ad.unpack_dual(torch.sin(dual) * view).tangent

    check(tangent, torch.randn(8, 16))


def test_storage_questions_are_answered_as_torch_answers_them():
    x = torch.randn(8, 16)
    on_device = x.to(D)
    views = [lambda t: t, lambda t: t[:2], lambda t: t.t(), lambda t: t[:2].clone(), lambda t: t.view(-1)[:16]]
    for question in (torch.ops.aten.is_same_size, torch.ops.aten._has_same_storage_numel):
        for view in views:
            assert question(view(on_device), on_device) == question(view(x), x)
            assert question(on_device, view(on_device)) == question(x, view(x))
