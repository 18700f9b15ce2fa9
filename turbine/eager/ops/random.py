"""Random ops: drawn from torch's CPU generator, so a seed gives torch's CPU numbers."""

from __future__ import annotations

from typing import Any

import torch

from turbine.counters import counters
from turbine.eager import host
from turbine.eager.registry import Continue, declare
from turbine.eager.schema import bound_arguments
from turbine.eager.transfer import to_device

aten = torch.ops.aten


def _random(func: Any, args: tuple, kwargs: dict) -> Any:
    counters.host_ops[str(func)] += 1
    return host.run_on_host(func, args, kwargs, host.device_of(args, kwargs))


def _native_dropout(func: Any, args: tuple, kwargs: dict) -> Any:
    """Dropout with the noise torch's CPU dropout draws, so a seed gives torch's CPU numbers.

    torch's CPU kernel fills a tensor shaped like the input with ``bernoulli_(1 - p)`` from its
    CPU generator, divides it by ``1 - p`` and multiplies; the noise is drawn the same way on the
    host (one upload) and the arithmetic runs as kernels.
    """
    input, p = args[0], args[1]
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if train is False or p == 0:
        return torch._decomp.decomposition_table[func](*args, **kwargs)
    counters.host_ops[str(func)] += 1
    keep = 1.0 - p
    # laid out as torch's empty_like lays it out for the input: drawn in the input's memory order
    noise = torch.empty_like(torch.empty_strided(tuple(input.shape), tuple(input.stride()), dtype=input.dtype)).bernoulli_(keep)
    device_noise = to_device(noise, input._storage.device)
    mask = device_noise != 0
    if keep == 0:
        return input * torch.zeros((), dtype=input.dtype, device=input.device), mask
    return input * (device_noise / keep), mask


def _rrelu_with_noise(func: Any, args: tuple, kwargs: dict) -> Any:
    """Training-mode rrelu draws a slope per non-positive element from torch's CPU generator
    (writing it into ``noise``): on the host, so a seed gives torch's CPU numbers. Evaluation
    is deterministic and runs as a kernel: a leaky relu with the mean slope, as torch computes it
    (in place for ``rrelu_with_noise_``, which writes two arguments, a kind of op turbine plans
    no other way)."""
    named = bound_arguments(func, args, kwargs)
    if named.get("training", False):
        return _random(func, args, kwargs)
    if func is aten.rrelu_with_noise_.default:
        return aten.leaky_relu_.default(named["self"], (named.get("lower", 1 / 8) + named.get("upper", 1 / 3)) / 2)
    return Continue(args, kwargs)


RANDOM = [
    "uniform_.default", "normal_.default", "bernoulli_.float", "bernoulli_.Tensor", "bernoulli.default",
    "bernoulli.p", "random_.default", "random_.from", "random_.to", "exponential_.default", "geometric_.default",
    "log_normal_.default", "cauchy_.default", "rand_like.default", "randn_like.default", "randint_like.default",
    "randint_like.low_dtype", "multinomial.default", "normal.Tensor_float", "normal.float_Tensor",
    "normal.Tensor_Tensor", "poisson.default",
]

declare(RANDOM, "drawn on the host from torch's CPU generator, so a seed gives torch's CPU numbers", handler=_random)
declare(
    aten.native_dropout.default,
    "the noise is drawn on the host as torch's CPU dropout draws it (one upload); the arithmetic runs as kernels",
    handler=_native_dropout,
)
declare(
    [aten.rrelu_with_noise.default, aten.rrelu_with_noise_.default, aten.rrelu_with_noise_functional.default],
    "in training it draws its slopes from torch's CPU generator: run on the host, so a seed gives torch's "
    "CPU numbers; in evaluation a kernel",
    handler=_rrelu_with_noise,
)
