"""``F.embedding_bag`` and ``nn.EmbeddingBag`` (eager/ops/bags.py): every mode, bag layout and
option against torch on the CPU, forward and backward, on IREE's kernels alone; torch's errors."""

import pytest
import torch
import torch.nn.functional as F

import turbine
from checks import D

INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])

BAGS = {
    "offsets": {"input": INDICES, "offsets": torch.tensor([0, 4])},
    "empty bags": {"input": INDICES, "offsets": torch.tensor([0, 0, 4, 8])},
    "last offset included": {"input": INDICES, "offsets": torch.tensor([0, 3, 6, 8]), "include_last_offset": True},
    "2-d": {"input": INDICES.reshape(2, 4)},
    "padding": {"input": torch.tensor([1, 2, 2, 5, 2, 2, 2, 9]), "offsets": torch.tensor([0, 4, 6]), "padding_idx": 2},
    "2-d, negative padding": {"input": torch.tensor([[1, 2, 4], [2, 2, 2]]), "padding_idx": -8},
    "int32": {"input": INDICES.int(), "offsets": torch.tensor([0, 5], dtype=torch.int32)},
    "repeated rows": {"input": torch.tensor([3, 3, 3, 7]), "offsets": torch.tensor([0, 2])},
}


def _on(device: str, options: dict) -> dict:
    return {k: v.detach().to(device).requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v for k, v in options.items()}


def _bag_and_gradients(weight: torch.Tensor, options: dict, upstream: torch.Tensor) -> list[torch.Tensor]:
    weight = weight.detach().requires_grad_()
    output = F.embedding_bag(weight=weight, **options)
    wrt = [weight] + [v for v in options.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    return [output.cpu()] + [g.cpu() for g in torch.autograd.grad(output, wrt, upstream.to(output.device))]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("bags", sorted(BAGS))
def test_bags_and_their_gradients_match_torch(bags, mode, stats):
    options = dict(BAGS[bags], mode=mode)
    weight = torch.randn(10, 3)
    expected = F.embedding_bag(weight=weight, **options)
    upstream = torch.randn(expected.shape)
    with turbine.fallback("error"):
        actual = _bag_and_gradients(weight.to(D), _on(D, options), upstream)
    torch.testing.assert_close(actual, _bag_and_gradients(weight, options, upstream))
    assert stats()["executors"].get("iree", 0) > 0


@pytest.mark.parametrize("bags", ["offsets", "2-d", "padding"])
def test_per_sample_weights_and_their_gradient(bags):
    options = dict(BAGS[bags], mode="sum", per_sample_weights=torch.randn(BAGS[bags]["input"].shape, requires_grad=True))
    weight = torch.randn(10, 3)
    upstream = torch.randn(F.embedding_bag(weight=weight, **options).shape)
    with turbine.fallback("error"):
        actual = _bag_and_gradients(weight.to(D), _on(D, options), upstream)
    torch.testing.assert_close(actual, _bag_and_gradients(weight, options, upstream))


def test_max_norm_renormalises_the_rows_the_bags_read():
    weight = torch.randn(10, 3) * 3
    ours = weight.to(D)
    options = {"input": INDICES, "offsets": torch.tensor([0, 4]), "max_norm": 1.0}
    with turbine.fallback("error"):
        actual = F.embedding_bag(weight=ours, **_on(D, options)).cpu()
    torch.testing.assert_close(actual, F.embedding_bag(weight=weight, **options))
    torch.testing.assert_close(ours.cpu(), weight)  # renormalised in place on both sides


def test_an_embedding_bag_module_trains_like_torchs():
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 8, mode="mean"))
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 8, mode="mean"))
    model.load_state_dict(reference.state_dict())
    model = model.to(D)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (reference, model)]
    for _ in range(3):
        text, offsets, target = torch.randint(0, 20, (30,)), torch.tensor([0, 7, 7, 19]), torch.randn(4, 8)
        for m, optimizer, device in ((reference, optimizers[0], "cpu"), (model, optimizers[1], D)):
            optimizer.zero_grad()
            F.mse_loss(m[0](text.to(device), offsets.to(device)), target.to(device)).backward()
            optimizer.step()
    torch.testing.assert_close(model[0].weight.detach().cpu(), reference[0].weight.detach())


@pytest.mark.parametrize(
    "options, error",
    [
        ({"input": torch.tensor([1, 2])}, "offsets has to be a 1D Tensor but got None"),
        ({"input": torch.tensor([[1, 2]]), "offsets": torch.tensor([0])}, "if input is 2D, then offsets has to be None"),
        ({"input": torch.tensor([1, 2]), "offsets": torch.tensor([0]), "mode": "max", "per_sample_weights": torch.ones(2)}, "only supported for mode='sum'"),
        ({"input": torch.tensor([1, 2]), "offsets": torch.tensor([0]), "mode": "median"}, "mode has to be one of sum, mean or max"),
        ({"input": torch.tensor([1, 12]), "offsets": torch.tensor([0])}, r"Index 1 of input takes value 12 which is not in the valid range \[0, 10\)"),
        ({"input": torch.tensor([1.0, 2.0]), "offsets": torch.tensor([0])}, "indices"),
    ],
    ids=["no offsets", "2-d with offsets", "weights with max", "unknown mode", "index out of range", "float indices"],
)
def test_bad_arguments_raise_torchs_errors(options, error):
    weight = torch.randn(10, 3)
    with pytest.raises((ValueError, NotImplementedError, RuntimeError), match=error) as expected:
        F.embedding_bag(weight=weight, **options)
    with pytest.raises(type(expected.value), match=error):
        F.embedding_bag(weight=weight.to(D), **_on(D, options)).cpu()


def test_a_sparse_gradient_is_refused_with_the_way_out():
    weight = torch.randn(10, 3).to(D).requires_grad_()
    with pytest.raises(RuntimeError, match="pass sparse=False"):
        F.embedding_bag(INDICES.to(D), weight, torch.tensor([0, 4], device=D), sparse=True)
    with torch.no_grad():  # no gradient to give: the forward runs
        F.embedding_bag(INDICES.to(D), weight, torch.tensor([0, 4], device=D), sparse=True).cpu()
