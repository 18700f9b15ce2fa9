"""Views share storage with their base; in-place ops and out= write as in torch."""


import pytest
import torch

import turbine
from checks import D



def both(fn, x):
    """Run fn on a CPU copy and a turbine copy of x; return (expected, actual) bases after."""
    expected = x.clone()
    fn(expected)
    actual = x.to(D)
    fn(actual)
    return expected, actual.cpu()


def test_in_place_on_views_changes_the_base():
    x = torch.randn(4, 5)
    cases = [
        lambda t: t[0].add_(1),
        lambda t: t.t().mul_(2),
        lambda t: t.view(-1).__setitem__(3, 5.0),
        lambda t: t[:, 1:3].copy_(torch.ones(4, 2)),
        lambda t: t.diagonal().zero_(),
        lambda t: t[::2, ::3].sub_(3),
        lambda t: t.__setitem__((slice(None), 0), torch.arange(4.0)),
        lambda t: t[1].clamp_(min=0),
    ]
    for case in cases:
        expected, actual = both(case, x)
        torch.testing.assert_close(actual, expected)


def test_base_changes_are_seen_by_views():
    x = torch.randn(3, 4).to(D)
    y = x.view(12)
    z = x[1]
    x.add_(1)
    expected = x.cpu()
    torch.testing.assert_close(y.cpu(), expected.view(12))
    torch.testing.assert_close(z.cpu(), expected[1])


def test_non_contiguous_inputs_are_read_correctly():
    x = torch.randn(6, 8)
    xd = x.to(D)
    torch.testing.assert_close((xd.t() * 2).cpu(), x.t() * 2)
    torch.testing.assert_close((xd[::2, 1::3] + 1).cpu(), x[::2, 1::3] + 1)
    torch.testing.assert_close((xd[0].unsqueeze(0).expand(3, 8) * 1).cpu(), x[0].unsqueeze(0).expand(3, 8))
    torch.testing.assert_close(xd.t().contiguous().cpu(), x.t().contiguous())
    torch.testing.assert_close(xd.permute(1, 0)[2:5].sum(1).cpu(), x.permute(1, 0)[2:5].sum(1))


def test_view_metadata_matches_torch():
    x = torch.randn(4, 6)
    xd = x.to(D)
    for fn in [lambda t: t.t(), lambda t: t[1:, ::2], lambda t: t.view(2, 12), lambda t: t.unsqueeze(1), lambda t: t[2]]:
        e, a = fn(x), fn(xd)
        assert a.shape == e.shape and a.stride() == e.stride() and a.storage_offset() == e.storage_offset()
        assert a.is_contiguous() == e.is_contiguous()


def test_detach_data_clone_are_independent_as_in_torch():
    x = torch.randn(3).to(D)
    c = x.clone()
    d = x.detach()
    x.mul_(0)
    torch.testing.assert_close(d.cpu(), torch.zeros(3))
    assert c.abs().sum().item() > 0


def test_out_argument_writes_into_the_tensor():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(3, 4).to(D)
    result = torch.add(a.to(D), b.to(D), out=out)
    assert result is out
    torch.testing.assert_close(out.cpu(), a + b)
    values, indices = torch.empty(3).to(D), torch.empty(3, dtype=torch.int64).to(D)
    torch.max(a.to(D), dim=1, out=(values, indices))
    torch.testing.assert_close(values.cpu(), a.max(1).values)
    torch.testing.assert_close(indices.cpu(), a.max(1).indices)


def test_in_place_type_rules_follow_torch():
    x = torch.arange(4).to(D)
    try:
        x.add_(0.5)
    except RuntimeError as error:
        assert "can't be cast" in str(error)
    else:
        raise AssertionError("int tensor += float must fail as in torch")
    f = torch.randn(4)
    fd = f.to(D)
    fd.add_(torch.ones(4, dtype=torch.float64).to(D))
    torch.testing.assert_close(fd.cpu(), f + 1)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_an_in_place_op_whose_twin_orders_its_arguments_otherwise_runs_on_iree(n, stats):
    """``x.polygamma_(n)`` is ``polygamma(n, x)`` written into ``x``: the twin's arguments come in
    another order, so no twin was found and every call fell back."""
    x = torch.rand(6) + 0.5
    on_device = x.to(D)
    with turbine.fallback("error"):
        result = on_device.polygamma_(n)
    assert result is on_device
    torch.testing.assert_close(on_device.cpu(), x.polygamma_(n), rtol=1e-5, atol=1e-5)
    assert stats()["fallbacks"] == {}


def test_kernels_never_change_their_inputs():
    """IREE may hand an input buffer back as a result (iree-org/iree#16168); inputs must stay intact."""
    x = torch.randn(5, 4)
    xd = x.to(D)
    clone = xd.clone()
    clone[1:3] = 7.0
    clone.index_put_((torch.tensor([0, 4]).to(D),), torch.ones(2, 4).to(D))
    scattered = xd.scatter(0, torch.zeros(1, 4, dtype=torch.int64).to(D), torch.ones(1, 4).to(D))
    torch.testing.assert_close(xd.cpu(), x)
    torch.testing.assert_close(scattered.cpu(), x.scatter(0, torch.zeros(1, 4, dtype=torch.int64), torch.ones(1, 4)))


def test_results_handed_back_from_copied_inputs_wait_for_the_copy():
    """A kernel that returns its (copied) input does no work and may signal before the copy lands."""
    from turbine.eager import dispatch
    from turbine.kernels_cache import kernel_cache

    for _ in range(6):
        kernel_cache.clear_memory()
        dispatch.clear_plans()
        x = torch.randn(6, 8)
        xd = x.to(D)
        expected = torch.ops.aten.unsqueeze_copy.default(x.t(), 0)
        torch.testing.assert_close(torch.ops.aten.unsqueeze_copy.default(xd.t(), 0).cpu(), expected, rtol=0, atol=0)


def test_copies_share_the_buffer_of_their_input_s_elements():
    """``clone``, ``_unsafe_view`` (a reshape after a matmul) and ``contiguous()`` run no kernel of
    their own on a dense input (a gather on a strided one); writing into the copy leaves the input."""
    import turbine

    x = torch.randn(6, 8)
    xd = x.to(D)
    with turbine.fallback("error"):
        before = turbine.stats()["dispatches"]
        copies = [xd.clone(), torch.ops.aten._unsafe_view.default(xd, [8, 6]), torch.ops.aten.view_copy.default(xd, [48])]
        assert turbine.stats()["dispatches"] == before
        transposed = xd.t().contiguous()
        assert turbine.stats()["dispatches"] == before + 1, "one gather, and the copy is its result"
        for copy in copies + [transposed]:
            copy.mul_(2)
    torch.testing.assert_close(xd.cpu(), x, rtol=0, atol=0)
    expected = [x * 2, x.reshape(8, 6) * 2, x.reshape(48) * 2, x.t() * 2]
    for copy, value in zip(copies + [transposed], expected):
        torch.testing.assert_close(copy.cpu(), value, rtol=0, atol=0)


def test_data_shares_storage_without_autograd():
    x = torch.randn(3, 4)
    xd = x.to(D).requires_grad_()
    data = xd.data
    assert not data.requires_grad
    data[1].zero_()
    x[1].zero_()
    torch.testing.assert_close(xd.detach().cpu(), x)


def test_in_place_ops_that_change_the_shape():
    x = torch.randn(1, 3, 1)
    cases = [
        lambda t: t.squeeze_(),
        lambda t: t.squeeze_(0),
        lambda t: t.unsqueeze_(1),
        lambda t: t.squeeze_(2).t_(),
        lambda t: t.transpose_(0, 2),
        lambda t: t.as_strided_((3,), (1,)),
    ]
    for case in cases:
        expected, actual = x.clone(), x.to(D)
        assert case(expected) is expected and case(actual) is actual
        assert actual.shape == expected.shape and actual.stride() == expected.stride()
        torch.testing.assert_close(actual.cpu(), expected)


def test_out_tensors_are_resized_as_in_torch():
    a = torch.randn(2, 3)
    out = torch.empty(0).to(D)
    torch.mul(a.to(D), 2, out=out)
    torch.testing.assert_close(out.cpu(), a * 2)
    out = torch.zeros(5).to(D)
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.mul(a.to(D), 3, out=out)
    torch.testing.assert_close(out.cpu(), a * 3)


@pytest.mark.parametrize("policy", ["device", "host"])
@pytest.mark.parametrize("op", [torch.exp, torch.special.airy_ai], ids=["on a kernel", "on the fallback"])
def test_a_view_resized_as_an_out_tensor_writes_into_its_base_as_in_torch(op, policy):
    """torch resizes an ``out=`` tensor of another shape in place (contiguous from its offset,
    over its storage), so a view passed as ``out=`` writes into its base. turbine gave the view a
    storage of its own: the base never saw the result."""
    x = torch.randn(6)
    base, expected_base = torch.zeros(4, 7).to(D), torch.zeros(4, 7)
    out, expected_out = base[1:3, ::2], expected_base[1:3, ::2]
    with turbine.fallback(policy), pytest.warns(UserWarning, match="was resized"):
        result = op(x.to(D), out=out)
    op(x, out=expected_out)
    assert result is out
    assert (out.shape, out.stride(), out.storage_offset()) == (expected_out.shape, expected_out.stride(), expected_out.storage_offset())
    torch.testing.assert_close(base.cpu(), expected_base)


def test_a_view_grown_past_its_storage_still_writes_into_its_base_as_in_torch():
    """torch grows a storage in place, so a view resized beyond it (as an ``out=`` argument, or by
    ``resize_``) still shares it with its base; turbine gave the view a storage of its own."""
    for device in ("cpu", D):
        base = torch.zeros(4, device=device)
        with pytest.warns(UserWarning, match="was resized"):
            torch.add(torch.ones(3, device=device), 1, out=base[2:])
        grown = torch.zeros(6, device=device)
        view = grown[4:]
        view.resize_(4)
        view.fill_(7.0)
        if device == "cpu":
            expected = (base, grown, view)
        else:
            for ours, torchs in zip((base, grown, view), expected):
                torch.testing.assert_close(ours.cpu(), torchs)


def test_resize_keeps_the_elements_that_fit():
    x = torch.arange(6.0)
    xd = x.to(D)
    torch.testing.assert_close(xd.resize_(2, 2).cpu(), x.resize_(2, 2))
    grown = xd.resize_(3, 3)
    assert grown.shape == (3, 3)
    torch.testing.assert_close(grown.cpu().flatten()[:6], torch.arange(6.0))


def test_a_view_outside_its_storage_is_torch_s_error():
    x = torch.randn(10)
    with pytest.raises(RuntimeError) as expected:
        x.as_strided((2, 2), (1, 2), 10)
    with pytest.raises(RuntimeError) as actual:
        x.to(D).as_strided((2, 2), (1, 2), 10)
    assert str(actual.value) == str(expected.value)


def test_writing_an_expanded_view_raises_as_torch_does():
    """Found by tests/test_fuzz.py: two elements of an expanded view share memory, so torch
    refuses to write one; turbine wrote it."""
    base = torch.ones(3)
    ours = base.to(D)
    for write in (lambda t: t.mul_(2), lambda t: t.copy_(torch.zeros(2, 3, device=t.device)),
                  lambda t: torch.add(t, 1, out=t)):
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor") as theirs:
            write(base.unsqueeze(0).expand(2, 3))
        with pytest.raises(RuntimeError, match=str(theirs.value)[:60]):
            write(ours.unsqueeze(0).expand(2, 3))
    torch.testing.assert_close(ours.cpu(), base)


def test_writing_an_expanded_view_with_no_elements_is_allowed_as_in_torch():
    """Found by tests/test_fuzz.py: an expanded view with no elements shares no memory between
    two of them, so torch writes it (nothing changes); turbine raised the overlap error."""
    for device in ("cpu", D):
        empty = torch.zeros(2, 0, 1, device=device).expand(2, 0, 4)
        assert empty.mul_(torch.ones(4, device=device)).shape == (2, 0, 4)


_PARTLY_SHARED = {
    "copy_ of the next elements": lambda y: y[1:].copy_(y[:-1]),
    "out= over the input shifted": lambda y: torch.mul(y[:-1], 2, out=y[1:]),
    "in place with the transpose": lambda y: y[:4].view(2, 2).add_(y[:4].view(2, 2).t()),
    "in place with one of its elements": lambda y: y[1:].add_(y[2]),
    "index_put_ of its own elements": lambda y: y[1:].index_put_((torch.tensor([0, 1], device=y.device),), y[:2]),
    "clamp_ by its neighbours": lambda y: y[1:].clamp_(y[:-1], None),
}
_NOT_SHARED_ENOUGH = {
    "the same tensor": lambda y: y.add_(y),
    "another view of the same elements": lambda y: y.view(2, 3).mul_(y.view(2, 3).t().t()),
    "disjoint halves": lambda y: y[:3].add_(y[3:]),
    "interleaved, neither dense": lambda y: y[::2].mul_(y[1::2]),
    "an element outside": lambda y: y[1:].sub_(y[0]),
}


@pytest.mark.parametrize("name", sorted(_PARTLY_SHARED))
def test_an_input_that_partly_shares_the_written_memory_raises_as_torch_does(name):
    """turbine reads every input before it writes, so it computed an answer where torch's result
    would depend on its order of reads and writes, and torch refuses."""
    write = _PARTLY_SHARED[name]
    base = torch.arange(6.0)
    ours = base.to(D)
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor") as theirs:
        write(base)
    with pytest.raises(RuntimeError, match=str(theirs.value)[:60]):
        write(ours)
    torch.testing.assert_close(ours.cpu(), torch.arange(6.0))


@pytest.mark.parametrize("name", sorted(_NOT_SHARED_ENOUGH))
def test_inputs_torch_lets_share_the_written_memory_are_written(name):
    expected, actual = both(_NOT_SHARED_ENOUGH[name], torch.arange(6.0))
    torch.testing.assert_close(actual, expected)


def test_inputs_torch_does_not_check_are_read_before_the_write():
    """Where torch writes without a check (an expanded input, a reduction's out=), its result
    depends on its order of reads and writes; turbine's is that of reading every input first."""
    unchecked = (
        (lambda y: y[1:].add_(y[2:3].expand(5)), lambda y: y[1:].add_(y[2:3].clone().expand(5))),
        (lambda y: torch.sum(y.view(2, 3), 0, out=y[1:4]), lambda y: torch.sum(y.view(2, 3).clone(), 0, out=y[1:4])),
    )
    for write, read_first in unchecked:
        ours = torch.arange(6.0).to(D)
        write(ours)
        expected = torch.arange(6.0)
        read_first(expected)
        torch.testing.assert_close(ours.cpu(), expected)
