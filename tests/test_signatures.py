"""What a kernel signature holds: runtime scalars never recompile; shapes, dims and dtypes do."""


import torch
from checks import D



def test_scalar_multiplier_compiles_once(stats):
    x = torch.randn(7, 3)
    xd = x.to(D)
    for i in range(20):
        s = 0.37 * i - 2.0
        torch.testing.assert_close((xd * s).cpu(), x * s)
    assert stats()["kernels_compiled"] <= 1


def test_add_alpha_compiles_once(stats):
    x, y = torch.randn(5, 2), torch.randn(5, 2)
    xd, yd = x.to(D), y.to(D)
    for i in range(20):
        a = 0.5 * i - 3
        torch.testing.assert_close(torch.add(xd, yd, alpha=a).cpu(), torch.add(x, y, alpha=a))
    assert stats()["kernels_compiled"] <= 1


def test_learning_rate_changes_do_not_recompile(stats):
    w = torch.randn(4, 4).to(D)
    g = torch.randn(4, 4).to(D)
    w.sub_(g, alpha=0.1)
    compiled = stats()["kernels_compiled"]
    for lr in [0.05, 0.01, 0.2, 0.3]:
        w.sub_(g, alpha=lr)
    assert stats()["kernels_compiled"] == compiled


def test_new_shape_dim_or_dtype_compiles_anew(stats):
    # Each result is read: a new kernel compiles in the background until its result is needed.
    x = torch.randn(4, 6).to(D)
    x.sum(0).cpu()
    first = stats()["kernels_compiled"]
    assert first >= 1
    x.sum(0).cpu()
    assert stats()["kernels_compiled"] == first
    x.sum(1).cpu()
    assert stats()["kernels_compiled"] == first + 1
    torch.randn(5, 6).to(D).sum(1).cpu()
    assert stats()["kernels_compiled"] == first + 2
    x.double().sum(1).cpu()
    assert stats()["kernels_compiled"] >= first + 3


def test_kernels_are_shared_by_tensors_of_one_signature(stats):
    a, b = torch.randn(3, 3).to(D), torch.randn(3, 3).to(D)
    torch.exp(a).cpu()
    compiled = stats()["kernels_compiled"]
    hits = stats()["cache_hits_memory"]
    torch.testing.assert_close(torch.exp(b).cpu(), torch.exp(b.cpu()))
    assert stats()["kernels_compiled"] == compiled
    assert stats()["dispatches"] >= 2 and stats()["cache_hits_memory"] == hits  # the plan holds the kernel
