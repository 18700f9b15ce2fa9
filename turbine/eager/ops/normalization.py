"""Batch norm on a turbine device: running statistics updated as torch updates them, one kernel a call.

torch's eager batch norm reaches a device as ``native_batch_norm``, whose schema does not say that
it writes ``running_mean`` and ``running_var`` (torch's CPU and CUDA kernels update them in
place). Run as a plain kernel, a model's running statistics would never move. So the op is routed
here, by mode, to the overloads whose schemas say what they do:

- training with running statistics: ``_native_batch_norm_legit``, which marks them written;
  dispatch runs its ``_functional`` twin and writes the new statistics into their storages;
- training without them: ``_native_batch_norm_legit.no_stats``;
- evaluation: ``_native_batch_norm_legit_no_training`` (traced as
  ``decompositions.normalization.batch_norm_eval``, with the shapes of torch's shape rule).

The newer ``_batch_norm_with_update`` / ``_batch_norm_no_update`` pair (what torch.export emits)
takes the same routes; their ``reserve`` result is an empty tensor, made without a kernel, and their
gradient (``batch_norm_backward``) is ``native_batch_norm_backward``.
"""

from __future__ import annotations

from typing import Any

import torch

from turbine.eager.registry import Continue, declare
from turbine.eager.tensor import empty

aten = torch.ops.aten


def native_batch_norm(func: Any, args: tuple, kwargs: dict) -> tuple:
    """``native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)``."""
    input, weight, bias, running_mean, running_var, training, momentum, eps = _arguments(func, args, kwargs)
    if training:
        if running_mean is None:
            return aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
        return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return _evaluate(input, weight, bias, running_mean, running_var, momentum, eps)


def native_batch_norm_legit(func: Any, args: tuple, kwargs: dict) -> Any:
    """``_native_batch_norm_legit`` called with ``training=False`` evaluates; training goes on the
    planned way (its functional twin, then the running statistics written)."""
    input, weight, bias, running_mean, running_var, training, momentum, eps = _arguments(func, args, kwargs)
    if training:
        return Continue(args, kwargs)
    return _evaluate(input, weight, bias, running_mean, running_var, momentum, eps)


def _evaluate(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: float, eps: float) -> tuple:
    """Evaluation mode: the normalised input and saved statistics of the shape rule's [C] (as torch's
    CUDA kernel gives; its CPU kernel gives empty ones)."""
    _require_statistics(running_mean, running_var)
    return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean, running_var, momentum, eps)


def batch_norm_with_update(func: Any, args: tuple, kwargs: dict) -> tuple:
    """``_batch_norm_with_update``: training, running statistics written."""
    input, weight, bias, running_mean, running_var, momentum, eps = _arguments(func, args, kwargs)
    results = aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return (*results, _reserve(input))


def batch_norm_no_update(func: Any, args: tuple, kwargs: dict) -> tuple:
    """``_batch_norm_no_update``: evaluation with the running statistics, or training without any."""
    input, weight, bias, running_mean, running_var, momentum, eps = _arguments(func, args, kwargs)
    if running_mean is None:
        results = aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
    else:
        _require_statistics(running_mean, running_var)
        results = aten._native_batch_norm_legit_no_training.default(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
    return (*results, _reserve(input))


def batch_norm_backward(func: Any, args: tuple, kwargs: dict) -> tuple:
    """``batch_norm_backward``, the ``_batch_norm_*_update`` ops' gradient: ``native_batch_norm_backward``
    without the empty ``reserve`` (which no CPU or IREE kernel reads; an empty argument sent the
    whole call to the fallback)."""
    grad, input, weight, running_mean, running_var, save_mean, save_var, update, eps, mask, _ = _arguments(func, args, kwargs)
    return aten.native_batch_norm_backward.default(grad, input, weight, running_mean, running_var, save_mean, save_var, update, eps, mask)


def _arguments(func: Any, args: tuple, kwargs: dict) -> list:
    """The op's arguments by position, keyword arguments put in their places."""
    names = [a.name for a in func._schema.arguments]
    return list(args) + [kwargs[name] for name in names[len(args) :]]


def _require_statistics(running_mean: Any, running_var: Any) -> None:
    if running_mean is None or running_var is None:
        raise RuntimeError("running_mean and running_var must be defined in evaluation mode")


def _reserve(input: torch.Tensor) -> torch.Tensor:
    """The empty ``reserve`` result of the ``_batch_norm_*_update`` ops (cuDNN's workspace elsewhere)."""
    return empty((0,), torch.uint8, input._storage.device)


declare(
    aten.native_batch_norm.default,
    "its schema hides that it writes the running statistics: routed by mode to the _native_batch_norm_legit "
    "overloads whose schemas say what they write",
    handler=native_batch_norm,
)
declare(
    aten._native_batch_norm_legit.default,
    "with training=False it evaluates (the _no_training overload): its functional twin's shape rule and torch's "
    "CPU kernel disagree on the saved statistics' shape, which failed the call",
    handler=native_batch_norm_legit,
)
declare(
    aten._batch_norm_with_update.default,
    "training: _native_batch_norm_legit, which writes the running statistics; the reserve result is empty",
    handler=batch_norm_with_update,
)
declare(
    aten._batch_norm_no_update.default,
    "evaluation with running statistics, or training without: the _native_batch_norm_legit overloads",
    handler=batch_norm_no_update,
)
declare(
    aten.batch_norm_backward.default,
    "native_batch_norm_backward without the empty reserve, which made the call read an empty tensor (the fallback)",
    handler=batch_norm_backward,
)
