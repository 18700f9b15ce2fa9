"""Recurrent networks (eager/decompositions/recurrent.py, eager/ops/recurrent.py): ``nn.LSTM``,
``nn.GRU`` and ``nn.RNN`` and their cells train on the device as on the CPU, padded or packed.

Off the CPU torch runs LSTM and GRU steps as its fused cells, which it has for CUDA alone: on
turbine:cpu every LSTM and GRU failed. Packed sequences keep their lengths and batch sizes on the
CPU, which turbine's same-device check refused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import turbine
from checks import D

pytestmark = pytest.mark.slow  # each case compiles its step kernels (5-15 s)

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


class Tagger(nn.Module):
    """An embedding, a two-layer bidirectional recurrent net and a linear head over each step."""

    def __init__(self, kind: str, bias: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 8, padding_idx=0)
        self.recurrent = getattr(nn, kind)(8, 12, num_layers=2, bias=bias, batch_first=True, bidirectional=True)
        self.head = nn.Linear(24, 5)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        steps = self.embedding(tokens)
        if lengths is not None:
            steps = nn.utils.rnn.pack_padded_sequence(steps, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.recurrent(steps)
        if lengths is not None:
            out, out_lengths = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
            assert out_lengths.device.type == "cpu"  # as torch gives them for CUDA
        return self.head(out)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    tokens = torch.randint(1, 20, (3, 7))
    tokens[1, 5:] = 0
    tokens[2, 3:] = 0
    return tokens, torch.tensor([7, 5, 3])


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_recurrent_tagger_trains_as_on_the_cpu(kind, bias, packed, stats):
    torch.manual_seed(1)
    reference = Tagger(kind, bias)
    ours = copy.deepcopy(reference).to(D)
    tokens, lengths = _batch()
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (reference, ours)]
    for _ in range(3):
        for model, optimizer, device in zip((reference, ours), optimizers, ("cpu", D)):
            optimizer.zero_grad()
            loss = model(tokens.to(device), lengths if packed else None).square().mean()
            loss.backward()
            optimizer.step()
            if device == "cpu":
                expected = loss.detach()
            else:
                torch.testing.assert_close(loss.cpu(), expected, **TOLERANCE)
    for (name, p), q in zip(ours.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **TOLERANCE, msg=lambda m: f"{name}: {m}")
    assert not stats()["fallbacks"], stats()["fallbacks"]  # IREE ran every op, the fused cells included


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_cells_give_torchs_values_and_gradients(kind):
    torch.manual_seed(2)
    cell = getattr(nn, kind)(6, 5)
    ours = copy.deepcopy(cell).to(D)
    x = torch.randn(4, 6)
    state = (torch.randn(4, 5), torch.randn(4, 5)) if kind == "LSTMCell" else torch.randn(4, 5)
    on_device = tuple(s.to(D) for s in state) if kind == "LSTMCell" else state.to(D)
    expected, actual = cell(x, state), ours(x.to(D), on_device)
    expected, actual = (expected, actual) if kind == "LSTMCell" else ((expected,), (actual,))
    sum(e.sum() for e in expected).backward()
    sum(a.sum() for a in actual).backward()
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e.detach(), **TOLERANCE)
    for p, q in zip(ours.parameters(), cell.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOLERANCE)


def test_packing_checks_the_lengths_as_torch_does():
    steps = torch.randn(3, 4, 2)
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        nn.utils.rnn.pack_padded_sequence(steps.to(D), torch.tensor([2, 4, 3]), batch_first=True)
    with pytest.raises(RuntimeError, match="lengths' argument should be a 1D CPU int64 tensor"):
        torch.ops.aten._pack_padded_sequence(steps.to(D), torch.tensor([4, 3, 2], device=D), True)
    packed = nn.utils.rnn.pack_padded_sequence(steps.to(D), torch.tensor([4, 3, 2]), batch_first=True)
    expected = nn.utils.rnn.pack_padded_sequence(steps, torch.tensor([4, 3, 2]), batch_first=True)
    assert isinstance(packed.data, turbine.DeviceTensor) and packed.batch_sizes.device.type == "cpu"
    torch.testing.assert_close(packed.data.cpu(), expected.data)
    torch.testing.assert_close(packed.batch_sizes, expected.batch_sizes)
