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


def test_new_shape_dim_or_dtype_compiles_anew(fresh_cache, stats):
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


def test_the_short_walk_of_tensor_only_calls_gives_walks_leaves():
    """dispatch walks a call of positional DeviceTensors alone by a short loop: the same plan key,
    tensors and device as the full walk, and no short walk for any other call."""
    from turbine.eager.dispatch import _schema
    from turbine.eager.signature import walk, walk_tensors

    aten = torch.ops.aten
    x, y = torch.randn(4, 3).to(D), torch.randn(3, 4).to(D)
    view = y.t()  # not dense: its key holds its strides
    for func, args in [(aten.mm.default, (x, y)), (aten.add.Tensor, (x, view)), (aten.relu.default, (view,))]:
        short, full = walk_tensors(func, args), walk(func, _schema(func), args, {})
        assert short.key == full.key and short.tensors == full.tensors and short.device is full.device
        assert short.scalars == full.scalars == []
    assert walk_tensors(aten.add.Tensor, (x, 2.0)) is None  # a scalar: the full walk
    assert walk_tensors(aten.add.Tensor, (x, torch.randn(4, 3).to("turbine:cpu3"))) is None  # two devices: walk raises


def test_a_view_made_from_its_plans_layout_is_the_view_torch_describes():
    """View plans make their views from a layout worked out once (tensor.ViewLayout): the same
    geometry, dense flag and plan key as a DeviceTensor built from the geometry."""
    from turbine.eager.tensor import DeviceTensor, ViewLayout, torch_device

    base = torch.randn(6, 4).to(D)
    storage = base._storage
    for sizes, strides, offset in [((6, 4), (4, 1), 0), ((4, 6), (1, 4), 0), ((2, 4), (4, 1), 8), ((24,), (1,), 0)]:
        made = ViewLayout(sizes, strides, offset, storage.numel, storage.dtype).make(storage, torch_device(storage.device))
        built = DeviceTensor(storage, sizes, strides, offset)
        assert (made.shape, made.stride(), made.storage_offset()) == (built.shape, built.stride(), built.storage_offset())
        assert (made._dense, made._key) == (built._dense, built._key) and made._storage is storage
        torch.testing.assert_close(made.cpu(), base.cpu().as_strided(sizes, strides, offset))
