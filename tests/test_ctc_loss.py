"""CTC loss on the device (eager/ops/ctc.py): lengths as torch CUDA takes them (lists, CPU
tensors, device tensors), targets on the CPU or the device, and targets out of the classes
reported instead of read outside ``log_probs``."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import turbine
from checks import D

F = torch.nn.functional


@pytest.fixture(autouse=True)
def _quiet_fallback():
    """IREE 3.13 cannot compile the CTC kernels: torch's kernel runs them over the device memory."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", turbine.TurbineFallbackWarning)
        yield


def _problem(padding: int = 0):
    """Log-probabilities (T=12, N=3, C=6), padded targets (a padding value past each sample's
    length), the input and target lengths."""
    torch.manual_seed(0)
    log_probs = torch.randn(12, 3, 6).log_softmax(2)
    targets = torch.tensor([[1, 2, 3, 4], [2, 5, padding, padding], [4, 4, 1, padding]])
    return log_probs, targets, torch.tensor([12, 10, 11]), torch.tensor([4, 2, 3])


def _on_device(log_probs, targets, input_lengths, target_lengths, where: str, **options):
    """Loss and gradient on the device, with the lengths (and targets) given as ``where`` says."""
    leaf = log_probs.detach().to(D).requires_grad_()
    if where == "lists":
        input_lengths, target_lengths = input_lengths.tolist(), target_lengths.tolist()
    elif where == "device":
        input_lengths, target_lengths, targets = input_lengths.to(D), target_lengths.to(D), targets.to(D)
    elif where == "cpu lengths":
        targets = targets.to(D)
    # "cpu": targets and lengths on the CPU, log_probs alone on the device (cuDNN's own layout)
    loss = F.ctc_loss(leaf, targets, input_lengths, target_lengths, **options)
    loss.sum().backward()
    return loss.cpu(), leaf.grad.cpu()


@pytest.mark.parametrize("where", ["lists", "device", "cpu lengths", "cpu"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_lengths_and_targets_where_torch_cuda_takes_them(where, reduction, stats):
    log_probs, targets, input_lengths, target_lengths = _problem()
    leaf = log_probs.clone().requires_grad_()
    expected = F.ctc_loss(leaf, targets, input_lengths, target_lengths, reduction=reduction)
    expected.sum().backward()
    loss, grad = _on_device(log_probs, targets, input_lengths, target_lengths, where, reduction=reduction)
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grad, leaf.grad)
    assert stats()["fallbacks"].get("aten._ctc_loss.default")  # torch's kernel (IREE 3.13 cannot compile it), checked


def test_torch_ctc_loss_called_directly_takes_cpu_lengths_and_keywords():
    log_probs, targets, input_lengths, target_lengths = _problem()
    named = {"input_lengths": input_lengths, "target_lengths": target_lengths}
    expected = torch.ctc_loss(log_probs=log_probs, targets=targets, **named)  # torch's own tensors: untouched
    actual = torch.ctc_loss(log_probs=log_probs.to(D), targets=targets.to(D), **named)
    torch.testing.assert_close(actual.cpu(), expected)
    torch.testing.assert_close(torch.ctc_loss(log_probs.to(D), targets.to(D), input_lengths, target_lengths=target_lengths).cpu(), expected)
    assert F.one_hot(input=torch.tensor([1, 0])).tolist() == [[0, 1], [1, 0]]  # the mode passes keywords too


def test_the_aten_overload_with_tensor_lengths_checks_its_targets():
    """Reached where the function mode is not (a thread started before turbine, a direct call)."""
    log_probs, targets, input_lengths, target_lengths = _problem()
    targets[0, 2] = 9
    with pytest.raises(RuntimeError, match=r"targets\[2\] \(counted flat\) is 9"):
        torch.ops.aten._ctc_loss.Tensor(log_probs.to(D), targets.to(D), input_lengths.to(D), target_lengths.to(D))[0].cpu()


def test_target_lengths_for_another_batch_get_torchs_error():
    log_probs, targets, input_lengths, _ = _problem()
    with pytest.raises(RuntimeError, match="target_lengths must be of size batch_size"):
        F.ctc_loss(log_probs.to(D), targets.to(D), input_lengths, [3, 2, 1, 1])


def test_padding_past_the_target_lengths_is_not_checked():
    """Padding may hold anything (torch never reads it): a padding of 99 or -1 gives the loss of
    a padding of 0, and no error. (Concatenated targets have no padding: torch wants exactly the
    lengths' sum.)"""
    log_probs, targets, input_lengths, target_lengths = _problem(padding=0)
    expected = F.ctc_loss(log_probs, targets, input_lengths, target_lengths)
    for padding in (99, -1):
        _, padded, _, _ = _problem(padding)
        torch.testing.assert_close(F.ctc_loss(log_probs.to(D), padded.to(D), input_lengths, target_lengths).cpu(), expected)


@pytest.mark.parametrize("bad", [6, -2, 10**11])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_a_target_outside_the_classes_is_reported_and_the_device_runs_on(bad, layout):
    """torch's kernels index log_probs with each target unchecked (on the CPU a target of 99 gave a
    loss of -5e18, or NaN); turbine reports the first one at the next read."""
    log_probs, targets, input_lengths, target_lengths = _problem()
    targets[2, 1] = bad
    if layout == "concatenated":
        targets = torch.cat([row[:length] for row, length in zip(targets, target_lengths)])
    position = 7 if layout == "concatenated" else 9  # 4 + 2 targets before it, or row 2 of width 4
    leaf = log_probs.to(D).requires_grad_()
    with pytest.raises(RuntimeError, match=rf"ctc_loss: targets\[{position}\] \(counted flat\) is {bad}, outside \[0, 6\)"):
        loss = F.ctc_loss(leaf, targets.to(D), input_lengths, target_lengths)
        loss.backward()
        loss.cpu()
    with contextlib.suppress(RuntimeError):
        turbine.synchronize(D)  # the backward's own report
    torch.testing.assert_close((log_probs.to(D) * 2).cpu(), log_probs * 2)


def test_lengths_must_be_integers():
    log_probs, targets, input_lengths, target_lengths = _problem()
    with pytest.raises(RuntimeError, match="target_lengths must be integral"):
        F.ctc_loss(log_probs.to(D), targets.to(D), input_lengths, target_lengths.float())
