"""Recurrent networks: packed sequences' lengths on the CPU, and LSTM cells without biases.
(The fused LSTM and GRU cells themselves are decompositions: eager/decompositions/recurrent.py.)

Packed sequences (``nn.utils.rnn.pack_padded_sequence``): their lengths and batch sizes stay
on the CPU, as torch keeps them for CUDA tensors.

``_pack_padded_sequence`` takes the sequences' lengths as a CPU tensor and returns the packed
data on the input's device with its batch sizes on the CPU; the RNNs and
``pad_packed_sequence`` read the batch sizes on the host. turbine's same-device check refused
the CPU lengths, so no packed sequence reached an ``nn.LSTM`` on a turbine device. The ops that
take batch sizes (torch's composites, ``lstm.data`` among them) read them on the host before
any turbine op sees them.
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager.registry import Continue, declare
from turbine.eager.schema import as_call, bound_arguments
from turbine.eager.tensor import DeviceTensor
from turbine.eager.views import meta_like

aten = torch.ops.aten


def _pack_padded_sequence(func: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed data, time step by time step, gathered on the device in one indexing op; the
    batch sizes (and torch's checks of the lengths) from torch's own kernel on a meta stand-in."""
    bound = bound_arguments(func, args, kwargs)
    input, lengths, batch_first = bound["input"], bound["lengths"], bound["batch_first"]
    if isinstance(lengths, DeviceTensor):
        raise RuntimeError(
            f"'lengths' argument should be a 1D CPU int64 tensor, but got {lengths.dim()}D {lengths.dtype} tensor on "
            f"{lengths.device}: pass lengths.cpu(), as torch wants for CUDA"
        )
    _, batch_sizes = func(meta_like(input), lengths, batch_first)
    steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
    step = torch.arange(len(batch_sizes)).unsqueeze(1)
    sample = torch.arange(batch).unsqueeze(0)
    rows = sample * steps + step if batch_first else step * batch + sample
    kept = rows[sample < batch_sizes.unsqueeze(1)]  # time-major: step 0's samples, then step 1's, ...
    flat = input.reshape(steps * batch, *input.shape[2:])
    return flat[kept], batch_sizes


declare(
    aten._pack_padded_sequence.default,
    "the lengths come on the CPU and the batch sizes go back on it, as torch keeps them for CUDA",
    handler=_pack_padded_sequence,
)


def _zero_biases(func: Any, args: tuple, kwargs: dict) -> Continue:
    """An LSTM cell without biases, as one with zero biases: torch's shape rule for the cell
    raised AttributeError without them (torch 2.13). The backward op knows from autograd that the
    cell had none, and gives no bias gradient."""
    bound = bound_arguments(func, args, kwargs)
    if bound.get("input_bias") is None:
        zeros = bound["input_gates"].new_zeros(bound["input_gates"].shape[1])
        bound["input_bias"], bound["hidden_bias"] = zeros, zeros
    return Continue(*as_call(func, bound))


declare(aten._thnn_fused_lstm_cell.default, "torch's shape rule for it fails without biases: zero biases stand in", handler=_zero_biases)
