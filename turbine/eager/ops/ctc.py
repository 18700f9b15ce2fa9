"""CTC loss: its lengths read on the host, as torch's kernels read them, and its targets checked.

torch's CTC kernels (CPU and CUDA) take the input and target lengths as host numbers, and
``torch.ctc_loss`` copies lengths given as tensors to the host first, so torch CUDA accepts them
on the CPU or on the GPU (and targets on the CPU). turbine does the same (eager/mode.py routes
the call here), where its same-device check refused CPU lengths.

A target is a class of ``log_probs``; torch's kernels index ``log_probs`` with it unchecked (on
the CPU a target out of range read outside the tensor and gave a loss of -5e18). The targets a
sample uses (the first ``target_lengths[n]`` of its row, or all of the concatenated targets)
are checked against the classes on the device (eager/index_checks.py); padding past them is not
read by torch and may hold anything.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from turbine.eager.index_checks import checked
from turbine.eager.registry import Continue, declare
from turbine.eager.schema import as_call, bound_arguments
from turbine.eager.tensor import DeviceTensor
from turbine.eager.views import to_host

aten = torch.ops.aten


def _host_lengths(lengths: Any, name: str) -> list[int]:
    """Lengths given as a tensor (on the CPU or a turbine device) as host numbers."""
    if not isinstance(lengths, torch.Tensor):
        return [int(length) for length in lengths]
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise RuntimeError(f"{name} must be integral")
    host = to_host(lengths) if isinstance(lengths, DeviceTensor) else lengths
    return [int(length) for length in host.reshape(-1).tolist()]


def ctc_loss(func: Callable, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``F.ctc_loss`` or ``torch.ctc_loss`` (``func``) with its lengths as host numbers, as torch
    runs them for its own tensors.

    For a tensor subclass torch keeps tensor lengths, and its mean reduction then divides the
    loss by them: lengths on the CPU (which torch CUDA takes, and cuDNN wants) failed turbine's
    same-device check. Targets on the CPU are moved to the device by torch, as for CUDA."""
    args = list(args)
    for position, name in ((2, "input_lengths"), (3, "target_lengths")):
        if position < len(args):
            args[position] = _host_lengths(args[position], name)
        elif name in kwargs:
            kwargs[name] = _host_lengths(kwargs[name], name)
    return func(*args, **kwargs)


def _with_host_lengths(func: Any, args: tuple, kwargs: dict) -> Any:
    """``_ctc_loss.Tensor`` and its backward, which torch reaches where the function mode does
    not (a thread without it, a direct call): their overloads taking host lengths, which check
    the targets."""
    bound = bound_arguments(func, args, kwargs)
    for name in ("input_lengths", "target_lengths"):
        bound[name] = _host_lengths(bound[name], name)
    overload = aten._ctc_loss.default if func is aten._ctc_loss.Tensor else aten._ctc_loss_backward.default
    return overload(**bound)


def _used_targets(targets: DeviceTensor, target_lengths: list[int]) -> DeviceTensor:
    """``targets`` with the padding no sample uses set to 0, a class in range. Only a padded
    batch (a row per sample) has padding: concatenated targets hold exactly the lengths' sum."""
    if targets.dim() != 2 or len(target_lengths) != targets.shape[0] or all(length >= targets.shape[1] for length in target_lengths):
        return targets  # (lengths for another batch: torch's shape rule says so)
    lengths = torch.tensor(target_lengths, device=targets.device).unsqueeze(1)
    used = torch.arange(targets.shape[1], device=targets.device).unsqueeze(0) < lengths
    return torch.where(used, targets, torch.zeros_like(targets))


def _checked_targets(func: Any, args: tuple, kwargs: dict) -> Continue:
    """The targets the samples use lie in ``[0, classes)``; the rest is replaced by 0 for the
    kernel, and the first one outside is reported at the next read."""
    bound = bound_arguments(func, args, kwargs)
    targets, log_probs = bound["targets"], bound["log_probs"]
    if not isinstance(targets, DeviceTensor) or targets.numel() == 0:
        return Continue(args, kwargs)
    classes = log_probs.shape[-1]
    error = lambda value, position: RuntimeError(  # noqa: E731
        f"ctc_loss: targets[{position}] (counted flat) is {value}, outside [0, {classes}): a target is a class of log_probs"
    )
    bound["targets"] = checked(_used_targets(targets, list(bound["target_lengths"])), 0, classes, error)
    return Continue(*as_call(func, bound))


declare(
    [aten._ctc_loss.Tensor, aten._ctc_loss_backward.Tensor],
    "its lengths are read on the host (CPU or device tensors), as torch's kernels read them",
    handler=_with_host_lengths,
)
declare(
    [aten._ctc_loss.default, aten._ctc_loss_backward.default],
    "the targets its samples use are checked against the classes of log_probs",
    handler=_checked_targets,
)
