"""The fused LSTM and GRU cells, which torch's ``nn.LSTM`` / ``nn.GRU`` (and their cells) call at
each time step on any device but the CPU, and their backward ops.

torch has kernels for them on CUDA alone, so on ``turbine:cpu`` neither IREE (no lowering) nor
the fallback (no CPU kernel) could run them, and every LSTM and GRU failed there. The math is
that of torch's CUDA kernels (aten/src/ATen/native/cuda/RNN.cu), including what each saves for
its backward in ``workspace``: the LSTM cell's activated gates ``[i, f, g, o]``, the GRU cell's
``[r, z, n, hx, hn + hidden bias of n]``. Gates are laid out as torch lays them out, one block of
``hidden`` columns per gate.

The GRU cell ops have no shape rule in torch either; turbine gives them one (a Meta kernel,
``_common.shape_rule``), so that it can plan them as it plans any op. torch's shape rule for the
LSTM cell fails without biases: eager/ops/recurrent.py gives such a cell zero biases.
"""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers, shape_rule

aten = torch.ops.aten


@registers(aten._thnn_fused_lstm_cell.default)
def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """torch's fused LSTM cell, which its LSTM modules call off the CPU (torch has it for CUDA only)."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


@registers(aten._thnn_fused_lstm_cell_backward_impl.default)
def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """The fused LSTM cell's backward: the gradients of its gates (pre-activation), of cx, and of
    the bias (the gates' gradient summed over the batch) where the cell had one."""
    i, f, g, o = workspace.chunk(4, 1)
    grad_hy = torch.zeros_like(cx) if grad_hy is None else grad_hy
    grad_cy = torch.zeros_like(cx) if grad_cy is None else grad_cy
    tanh_cy = cy.tanh()
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + grad_cy
    grad_gates = torch.cat(
        [grad_c * g * (1 - i) * i, grad_c * cx * (1 - f) * f, grad_c * i * (1 - g * g), grad_hy * tanh_cy * (1 - o) * o], 1
    )
    return grad_gates, grad_c * f, grad_gates.sum(0) if has_bias else None


@registers(aten._thnn_fused_gru_cell.default)
def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """torch's fused GRU cell, which its GRU modules call off the CPU (torch has it for CUDA only)."""
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    input_r, input_z, input_n = input_gates.chunk(3, 1)
    hidden_r, hidden_z, hidden_n = hidden_gates.chunk(3, 1)
    r = (input_r + hidden_r).sigmoid()
    z = (input_z + hidden_z).sigmoid()
    n = (input_n + r * hidden_n).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hidden_n], 1)


@registers(aten._thnn_fused_gru_cell_backward.default)
def gru_cell_backward(grad_hy, workspace, has_bias):
    """The fused GRU cell's backward: the gradients of its input and hidden gates, of hx, and of
    the two biases where the cell had them."""
    r, z, n, hx, hidden_n = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hidden_n * (1 - r) * r
    grad_z = grad_hy * (hx - n) * (1 - z) * z
    grad_input_gates = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_n * r], 1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hy * z, None, None
    return grad_input_gates, grad_hidden_gates, grad_hy * z, grad_input_gates.sum(0), grad_hidden_gates.sum(0)


@shape_rule("_thnn_fused_gru_cell")
def _gru_cell_shapes(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    return hx.new_empty(hx.shape), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


@shape_rule("_thnn_fused_gru_cell_backward")
def _gru_cell_backward_shapes(grad_hy, workspace, has_bias):
    gates = grad_hy.new_empty((grad_hy.shape[0], 3 * grad_hy.shape[1]))
    bias = grad_hy.new_empty((3 * grad_hy.shape[1],)) if has_bias else None
    return gates, gates.new_empty(gates.shape), grad_hy.new_empty(grad_hy.shape), bias, None if bias is None else bias.new_empty(bias.shape)

