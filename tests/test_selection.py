"""Ops whose result's size is a mask's count of true entries (eager/ops/selection.py): nonzero,
argwhere, masked_select, boolean masks as indices (read and written), unique and repeat_interleave
without an output size, with their gradients, on IREE's kernels alone; a new count compiles
nothing once the count's dim is dynamic."""

import pytest
import torch

import turbine
from checks import D


def _on_iree(fn, *tensors):
    """fn on turbine, with no fallback, against fn on the CPU."""
    with turbine.fallback("error"):
        actual = fn(*[t.to(D) for t in tensors]).cpu()
    expected = fn(*tensors)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(), (7,), (4, 5), (2, 3, 4)], ids=["0-d", "1-d", "2-d", "3-d"])
def test_nonzero_and_argwhere(shape):
    x = torch.randn(shape).round()
    _on_iree(torch.nonzero, x)
    _on_iree(torch.argwhere, x)
    _on_iree(lambda t: torch.nonzero(t > 100), x)  # no entry
    _on_iree(lambda t: torch.nonzero(t == t), x)  # every entry


def test_masked_select_broadcasts_its_mask_and_reads_any_dtype():
    x, mask = torch.randn(4, 5), torch.rand(5) > 0.5
    _on_iree(torch.masked_select, x, mask)
    _on_iree(lambda t: torch.masked_select(t, t > 0), x)
    _on_iree(lambda t: torch.masked_select(t, t > 0), torch.arange(-5, 6))


def test_masks_as_indices_read_and_write():
    x = torch.randn(4, 5)
    _on_iree(lambda t: t[t > 0], x)
    _on_iree(lambda t: t[:, t[0] > 0], x)
    _on_iree(lambda t: t[t[:, 0] > 0, 1:], x)

    def write(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        mask = t > 0
        t[mask] = torch.arange(8.0, device=t.device)[: int(mask.sum())] * 10  # values, not one value
        return t

    _on_iree(write, torch.tensor([[1.0, -2.0, 3.0], [4.0, -5.0, -6.0]]))
    _on_iree(write, -torch.ones(2, 3))  # no true entry: nothing written
    _on_iree(lambda t: torch.index_put(t, (t[:, 0] > 5,), torch.arange(5.0, device=t.device), accumulate=True), x)


def test_an_empty_tensor_has_no_nonzero_entries():
    _on_iree(torch.argwhere, torch.zeros(0, 3))
    _on_iree(torch.nonzero, torch.zeros(2, 0))


def test_gradients_through_masks():
    x = torch.randn(4, 5)
    for fn in (lambda t: t[t > 0], lambda t: torch.masked_select(t, t < 0.5)):
        ours, theirs = x.to(D).requires_grad_(), x.clone().requires_grad_()
        with turbine.fallback("error"):
            (fn(ours) ** 2).sum().backward()
        (fn(theirs) ** 2).sum().backward()
        torch.testing.assert_close(ours.grad.cpu(), theirs.grad)


def test_a_mask_of_the_wrong_shape_raises_torchs_error():
    x = torch.randn(4, 5)
    with pytest.raises(IndexError) as expected:
        x[torch.ones(3, dtype=torch.bool)]
    with pytest.raises(IndexError, match=str(expected.value).replace("[", r"\[").replace("]", r"\]")):
        x.to(D)[torch.ones(3, dtype=torch.bool, device=D)]


def test_new_counts_compile_nothing_once_the_count_is_dynamic(stats):
    x = torch.randn(64).to(D)
    for threshold in (0.0, 0.5):  # two counts: the count's dims become dynamic
        x[x > threshold].cpu()
    compiled = stats()["kernels_compiled"]
    for threshold in (-1.0, -0.5, 1.0, 1.5):
        x[x > threshold].cpu()
    assert stats()["kernels_compiled"] == compiled


UNIQUE_INPUTS = {
    "NaNs": torch.tensor([3.0, 1.0, float("nan"), 1.0, 2.0, float("nan")]),
    "2-d": torch.tensor([[2, 1], [1, 2]]),
    "3-d": torch.randint(0, 5, (3, 4, 5)),
    "one": torch.tensor([7.0]),
    "0-d": torch.tensor(4),
    "bool": torch.tensor([True, False, True, True]),
}


@pytest.mark.parametrize("counts", [False, True], ids=["", "counts"])
@pytest.mark.parametrize("inverse", [False, True], ids=["", "inverse"])
@pytest.mark.parametrize("name", sorted(UNIQUE_INPUTS))
def test_unique_and_unique_consecutive(name, inverse, counts):
    x = UNIQUE_INPUTS[name]
    for fn in (torch.unique, torch.unique_consecutive):
        with turbine.fallback("error"):
            actual = [t.cpu() for t in fn(x.to(D), return_inverse=inverse, return_counts=counts, **({"sorted": True} if fn is torch.unique else {}))]
        expected = fn(x, return_inverse=inverse, return_counts=counts)
        for ours, theirs in zip(actual, expected):
            assert ours.dtype == theirs.dtype
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0, equal_nan=True)


def test_repeat_interleave_without_an_output_size():
    """The result's size is the repeats' sum, read on the host; negative repeats are torch's error."""
    repeats, x = torch.tensor([2, 0, 3, 1]), torch.randn(4, 3)
    _on_iree(torch.repeat_interleave, repeats)
    _on_iree(lambda t, r: t.repeat_interleave(r, dim=0), x, repeats)
    _on_iree(lambda t, r: t.repeat_interleave(r, dim=1), x, torch.tensor([1, 2, 3]))
    ours, theirs = x.to(D).requires_grad_(), x.clone().requires_grad_()
    with turbine.fallback("error"):
        ours.repeat_interleave(repeats.to(D), dim=0).square().sum().backward()
    theirs.repeat_interleave(repeats, dim=0).square().sum().backward()
    torch.testing.assert_close(ours.grad.cpu(), theirs.grad)
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        torch.repeat_interleave(torch.tensor([1, -2], device=D)).cpu()


def test_bincount_counts_and_adds_weights_as_torch():
    """bincount (a mixture of experts counts the tokens routed to each expert with it): its size
    is the largest value plus one, or minlength; ones counted as int64, float32 weights added as
    float32 and any other as float64."""
    torch.manual_seed(0)
    experts = torch.randint(0, 8, (64,))
    _on_iree(torch.bincount, experts)
    _on_iree(lambda e: torch.bincount(e, minlength=12), experts)
    _on_iree(lambda e: torch.bincount(e.to(torch.uint8)), experts)
    _on_iree(lambda e: torch.bincount(e, minlength=3), torch.zeros(0, dtype=torch.int64))
    _on_iree(lambda e, w: torch.bincount(e, w), experts, torch.randint(-5, 5, (64,)))  # as float64
    weights = torch.rand(64)
    with turbine.fallback("error"):
        actual = torch.bincount(experts.to(D), weights.to(D)).cpu()
    torch.testing.assert_close(actual, torch.bincount(experts, weights))  # float32 sums: added in another order


@pytest.mark.parametrize(
    "values, weights",
    [
        (torch.tensor([3, -1, 2]), None),
        (torch.tensor([[1, 2]]), None),
        (torch.tensor([1.0]), None),
        (torch.tensor([True]), None),
        (torch.tensor([3, -1]), torch.ones(5)),  # the values are checked before the weights, as torch checks them
        (torch.tensor([3, 1]), torch.ones(5)),
    ],
    ids=["negative", "2-d", "float", "bool", "negative and weights of another length", "weights of another length"],
)
def test_bincount_refuses_what_torch_refuses(values, weights):
    with pytest.raises(Exception) as expected:
        torch.bincount(values, weights)
    with pytest.raises(type(expected.value)) as raised:
        torch.bincount(values.to(D), None if weights is None else weights.to(D))
    if type(expected.value) is RuntimeError:
        assert str(raised.value) == str(expected.value)


def test_bincount_of_no_values_is_int64_zeros_whatever_the_weights():
    """torch's quirk, kept: no values give int64 zeros of minlength, even with float weights of
    any length."""
    empty = torch.zeros(0, dtype=torch.int64)
    _on_iree(lambda e, w: torch.bincount(e, w, minlength=3), empty, torch.zeros(0))
    _on_iree(lambda e, w: torch.bincount(e, w, minlength=2), empty, torch.zeros(5))


def test_index_fills_gradient_for_a_tensor_value_sums_over_the_unique_indices(stats):
    """index_fill's gradient for a 0-d tensor value sums the gradient at the unique indices
    (``_unique``, which fell back)."""
    value, source, index = torch.tensor(2.0), torch.randn(4, 5), torch.tensor([1, 3, 1])
    grad = torch.randn(4, 5)
    leaves = [[t.clone().requires_grad_() for t in (value, source)], [t.to(D).requires_grad_() for t in (value, source)]]
    for (v, s), i, g in zip(leaves, (index, index.to(D)), (grad, grad.to(D))):
        with turbine.fallback("error"):
            s.index_fill(1, i, v).backward(g)
    for torchs, ours in zip(*leaves):
        torch.testing.assert_close(ours.grad.cpu(), torchs.grad)
    assert stats()["fallbacks"] == {}
    _on_iree(lambda t: torch.ops.aten._unique.default(t, True, True)[1], torch.tensor([3, 1, 3, 2, 1]))
