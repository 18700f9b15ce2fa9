"""Copies keep torch's memory order: ``memory_format=``, a dense input's own order, transfers.

Other ops' results are row-major on turbine (the README says so); these are the calls whose
strides code reads back: ``x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).view(...)``.
"""

import pytest
import torch

from checks import D, check
from turbine.eager import views

CHANNELS_LAST = torch.channels_last

COPIES = {
    "contiguous as channels-last": lambda x: x.contiguous(memory_format=CHANNELS_LAST),
    "to channels-last": lambda x: x.to(memory_format=CHANNELS_LAST),
    "to channels-last and float64": lambda x: x.to(torch.float64, memory_format=CHANNELS_LAST),
    "clone as channels-last": lambda x: x.clone(memory_format=CHANNELS_LAST),
    "clone of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST).clone(),
    "cast of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST).to(torch.bfloat16),
    "clone of a slice of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST)[:, :, 1:].clone(),
    "clone of a transpose": lambda x: x.transpose(1, 3).clone(),
    "clone of a slice of a transpose": lambda x: x.transpose(1, 3)[:, 1:].clone(),
    "cast of a strided slice": lambda x: x[..., ::2].double(),
    "clone of an expanded tensor": lambda x: x[:1].expand(3, 3, 4, 5).clone(),
    "contiguous of a channels-last tensor": lambda x: x.contiguous(memory_format=CHANNELS_LAST).contiguous(),
    "channels-last 3d": lambda x: x.unsqueeze(2).expand(2, 3, 2, 4, 5).clone(memory_format=torch.channels_last_3d),
    "to uint8 as channels-last": lambda x: (x * 10).to(torch.uint8, memory_format=CHANNELS_LAST),
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_copies_have_torchs_strides_and_values(name):
    x = torch.randn(2, 3, 4, 5)
    expected = COPIES[name](x)
    actual = COPIES[name](x.to(D))
    assert actual.stride() == expected.stride()
    assert actual.is_contiguous(memory_format=CHANNELS_LAST) == expected.is_contiguous(memory_format=CHANNELS_LAST)
    torch.testing.assert_close(actual.cpu(), expected)


def test_a_channels_last_tensor_reads_as_rows_of_channels():
    """The motivating call: a channels-last tensor viewed as (batch, pixels, channels)."""
    x = torch.randn(2, 3, 4, 5)
    expected = x.contiguous(memory_format=CHANNELS_LAST).permute(0, 2, 3, 1).view(2, -1, 3)
    actual = x.to(D).contiguous(memory_format=CHANNELS_LAST).permute(0, 2, 3, 1).view(2, -1, 3)
    torch.testing.assert_close(actual.cpu(), expected)


def test_a_copy_in_another_order_does_not_change_with_its_source():
    x = torch.randn(2, 3, 4, 5).to(D)
    copy = x.clone(memory_format=CHANNELS_LAST)
    before = copy.cpu()
    x.add_(1)
    torch.testing.assert_close(copy.cpu(), before)
    again = copy.clone()
    copy.mul_(2)
    torch.testing.assert_close(again.cpu(), before)


def test_empty_tensors_take_their_memory_format_and_strides():
    like = torch.empty(2, 3, 4, 5, device=D, memory_format=CHANNELS_LAST)
    assert like.stride() == torch.empty(2, 3, 4, 5, memory_format=CHANNELS_LAST).stride()
    assert torch.empty_like(like).stride() == like.stride()
    assert torch.empty_like(like, memory_format=torch.contiguous_format).is_contiguous()
    assert torch.empty_strided((2, 3), (1, 2), device=D).stride() == (1, 2)
    spread = torch.empty_strided((2, 3), (4, 1), device=D)  # gaps between rows: the storage spans them
    spread.copy_(torch.arange(6.0).view(2, 3))
    torch.testing.assert_close(spread.cpu(), torch.arange(6.0).view(2, 3))


def test_transfers_keep_a_dense_tensors_order_both_ways():
    for host in (torch.randn(2, 3, 4, 5).contiguous(memory_format=CHANNELS_LAST), torch.randn(3, 4).t()):
        moved = host.to(D)
        assert moved.stride() == host.stride()
        back = moved.cpu()
        assert back.stride() == host.stride()
        torch.testing.assert_close(back, host)
        torch.testing.assert_close((moved * 2).cpu(), host * 2)


def test_a_channels_last_model_trains_like_torch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1)).to(memory_format=CHANNELS_LAST)
    ours = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    ours.load_state_dict(model.state_dict())
    ours = ours.to(memory_format=CHANNELS_LAST).to(D)
    assert ours[0].weight.stride() == model[0].weight.stride()
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=CHANNELS_LAST)
    model(x).square().sum().backward()
    ours(x.to(D)).square().sum().backward()
    for theirs, mine in zip(model.parameters(), ours.parameters()):
        torch.testing.assert_close(mine.grad.cpu(), theirs.grad, rtol=1e-4, atol=1e-5)


ELEMENTWISE = {
    "relu": lambda x, b: torch.relu(x),
    "add a bias of [C, 1, 1]": lambda x, b: x + b,
    "mul by a number": lambda x, b: x * 2.5,
    "add itself": lambda x, b: torch.add(x, x, alpha=2),
    "where with a bias": lambda x, b: torch.where(x > 0, x, b),
    "sigmoid then pow": lambda x, b: torch.sigmoid(x).pow(2),
    "cast": lambda x, b: x.to(torch.float64) + 1,
    "compare": lambda x, b: x > b,
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("layout", ["channels-last", "transposed"])
def test_elementwise_ops_keep_their_inputs_memory_order_on_iree(name, layout):
    """torch's elementwise ops keep a channels-last (or transposed) input's order; turbine's ran
    on a row-major gather of it and gave row-major results."""
    x, b = torch.randn(2, 3, 4, 5), torch.randn(3, 1, 1)
    x = x.contiguous(memory_format=CHANNELS_LAST) if layout == "channels-last" else x.transpose(0, 3)
    expected = ELEMENTWISE[name](x, b)
    actual = check_and_return(ELEMENTWISE[name], x, b)
    assert actual.stride() == expected.stride()


def check_and_return(fn, *inputs):
    """``check``'s comparison (IREE kernels alone), and the turbine result."""
    results = []
    check(lambda *args: results.append(fn(*args)) or results[-1], *inputs)
    return results[0]


def test_elementwise_ops_on_inputs_in_different_orders_are_row_major():
    x = torch.randn(2, 3, 4, 5)
    mixed = check_and_return(lambda a, b: a.contiguous(memory_format=CHANNELS_LAST) + b, x, x)
    assert mixed.is_contiguous()


RANDOM = {
    "dropout of a transpose": lambda t: torch.nn.functional.dropout(t.t(), 0.5, True),
    "rand_like of a transpose": lambda t: torch.rand_like(t.t()),
    "uniform_ of a transposed copy": lambda t: t.t().clone().uniform_(),
    "normal_ of a transposed view": lambda t: t.t().normal_(),
    "bernoulli_ of a strided view": lambda t: t[:, ::2].bernoulli_(0.3),
    "dropout of a channels-last image": lambda t: torch.nn.functional.dropout(t.reshape(1, 3, 2, 2).contiguous(memory_format=CHANNELS_LAST), 0.5, True),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_a_seed_gives_torchs_numbers_in_any_memory_order(name):
    """Found by a probe of DETR: torch draws random numbers in a tensor's memory order; turbine
    drew them row-major, so a seeded dropout of a permuted tensor gave another mask."""
    x = torch.randn(3, 4)
    torch.manual_seed(0)
    expected = RANDOM[name](x.clone())
    torch.manual_seed(0)
    actual = RANDOM[name](x.clone().to(D))
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


def test_moves_between_devices_take_a_memory_format():
    x = torch.randn(2, 3, 4, 5)
    expected = x.to(memory_format=CHANNELS_LAST).stride()
    assert x.to(D, memory_format=CHANNELS_LAST).stride() == expected
    assert x.to(D, torch.float64, memory_format=CHANNELS_LAST).stride() == expected
    assert x.requires_grad_().to(D, memory_format=CHANNELS_LAST).stride() == expected
    assert x.detach().to(D).to("cpu", memory_format=CHANNELS_LAST).stride() == expected
    conv = torch.nn.Conv2d(3, 4, 3)
    assert conv.to(D, memory_format=CHANNELS_LAST).weight.stride() == torch.nn.Conv2d(3, 4, 3).to(memory_format=CHANNELS_LAST).weight.stride()


def test_an_empty_tensor_whose_strides_share_memory_is_written_as_in_torch():
    """torch's fill_ writes an empty_strided tensor with a stride of 0; turbine keeps such
    strides out, so that its in-place ops' overlap check does not refuse it."""
    filled = torch.empty_strided((2, 3), (0, 1), device=D).fill_(2)
    torch.testing.assert_close(filled.cpu(), torch.full((2, 3), 2.0))


def test_in_place_ops_on_a_channels_last_tensor_keep_it_so():
    x = torch.randn(2, 3, 4, 5)
    expected = x.contiguous(memory_format=CHANNELS_LAST)
    actual = expected.to(D)
    for t in (expected, actual):
        t.mul_(2).add_(torch.ones(3, 1, 1, device=t.device))
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


def test_a_kernel_stored_for_row_major_inputs_does_not_decide_a_channels_last_call():
    """Kernels are stored by sizes alone: the row-major call's kernel must not make the
    channels-last call's result row-major."""
    x = torch.randn(2, 3, 4, 7)
    (x.to(D) * 3).cpu()
    expected = x.contiguous(memory_format=CHANNELS_LAST) * 3
    actual = x.to(D).contiguous(memory_format=CHANNELS_LAST) * 3
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


def test_an_in_place_result_laid_out_as_its_target_takes_its_place_without_a_copy(monkeypatch):
    """The elementwise result already has the target's strides: its buffer is installed, no
    gather into row-major order and scatter back."""
    gathered = []  # the gather and scatter kernels' names, as views asks for them
    real_kernel = views._generic_kernel
    monkeypatch.setattr(views, "_generic_kernel", lambda name, *rest: gathered.append(name) or real_kernel(name, *rest))
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=CHANNELS_LAST)
    target = x.to(D)
    target.mul_(2).add_(1)
    assert not gathered
    torch.testing.assert_close(target.cpu(), x * 2 + 1)
