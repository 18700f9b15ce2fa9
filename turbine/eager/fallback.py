"""Running an op no IREE kernel can run, under the fallback policy (``TURBINE_FALLBACK``).

A policy is a choice among executors (eager/executors/): the cheapest of its executors that can
run the op on its device runs it.

- ``device`` (default): torch's own kernel over the same device memory, shared through DLPack
  without a copy (torch's CPU kernels for ``turbine:cpu*``, its CUDA kernels for ``turbine:cuda*``
  where torch has CUDA); devices torch cannot run on (hip without a ROCm torch, vulkan) take
  torch's CPU kernel on host copies instead.
- ``host``: copy the inputs to the CPU, run torch's CPU kernel, copy the results back (counted
  as host transfers).
- ``error``: raise an error naming the op, why IREE could not run it, and how to change policy.

``with turbine.fallback(policy):`` sets the calling thread's policy for a block; other threads
keep theirs. Each fallback is counted per op (``turbine.stats()["fallbacks"]``) and per executor
(``["executors"]``), and warned once per op with :class:`TurbineFallbackWarning`. Written
arguments are updated by writing new buffers into their storages, so buffers stay immutable
and views see the change.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

from turbine.counters import counters
from turbine.eager import host, runtime
from turbine.eager.executors import BY_POLICY, HOST, Executor
from turbine.errors import DeviceError, UnsupportedLayoutError, UnsupportedOpError

POLICIES = tuple(BY_POLICY)


class TurbineFallbackWarning(UserWarning):
    """An op ran with torch's kernel rather than a compiled IREE kernel (warned once per op)."""


@contextlib.contextmanager
def fallback(policy: str) -> Iterator[None]:
    """``with turbine.fallback("host"):`` sets this thread's fallback policy for a block."""
    with runtime.state.policy(_check(policy)):
        yield


def _check(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown turbine fallback policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return policy


def ranked(func: Any, device: Any, policy: str) -> list[Executor]:
    """The executors of ``policy`` that can run ``func`` on ``device``, cheapest first."""
    costs = [(cost, executor) for executor in BY_POLICY[policy] if (cost := executor.cost(func, device)) is not None]
    return [executor for _, executor in sorted(costs, key=lambda pair: pair[0])]


def choose(func: Any, device: Any, policy: str) -> Executor | None:
    """The cheapest executor of ``policy`` that can run ``func`` on ``device``, or None."""
    found = ranked(func, device, policy)
    return found[0] if found else None


def run(func: Any, args: tuple, kwargs: dict, reason: Exception) -> Any:
    """Run ``func`` by this thread's policy, after IREE could not (``reason`` says why): the
    cheapest executor that can, else the next (torch CUDA has no int64 matmul, its CPU has)."""
    state = runtime.state
    policy = _check(state.fallback_policy)
    why = first_line(reason)
    device = host.device_of(args, kwargs)
    candidates = ranked(func, device, policy)
    if not candidates:
        raise UnsupportedOpError(
            f"{func} cannot run as an IREE kernel ({why}) and the fallback policy is '{policy}'. Set "
            "TURBINE_FALLBACK=device (torch's kernel on the device memory) or host, or use "
            "`with turbine.fallback('device'):`."
        ) from reason
    failed = []
    for executor in candidates:
        try:
            result = executor.run(func, args, kwargs, device)
        except (DeviceError, UnsupportedLayoutError):
            raise  # out of memory, a lost device, a sparse result: no other executor does better
        except Exception as error:
            failed.append((executor, error))
            continue
        _count_and_warn(func, executor, policy, why)
        return result
    last, refusal = failed[-1]
    if last is HOST and _refuses_the_call(refusal):
        raise refusal from reason  # torch's CPU kernel refuses the call's arguments: torch's error, as torch gives it
    tried = "; nor ".join(f"{executor.description} ({first_line(error)})" for executor, error in failed)
    raise UnsupportedOpError(
        f"{func} could not run on {device.name if device else 'turbine'}: IREE could not run it ({why}), and "
        f"neither could {tried} under the '{policy}' fallback."
    ) from failed[0][1]


def _refuses_the_call(error: BaseException) -> bool:
    """Whether torch's CPU kernel, run on the call's own arguments, refused them (embedding_bag's
    "Index 1 of input takes value 9 which is not in the valid range [0, 5)", bincount's "only
    supports 1-d non-negative integral inputs"): a torch CPU user gets that error, and so does a
    turbine one, rather than a turbine error saying no executor could run the op. A kernel torch
    has not got for the dtype ("not implemented for 'Half'") is a gap, not a refusal."""
    return host.raised_by_torch(error) and not isinstance(error, NotImplementedError) and "not implemented" not in str(error)


def _count_and_warn(func: Any, executor: Executor, policy: str, why: str) -> None:
    name = str(func)
    counters.fallbacks[name] += 1
    counters.executors[executor.name] += 1
    if name not in runtime.state.warned:
        runtime.state.warned.add(name)
        warnings.warn(
            f"turbine: {name} runs with {executor.description} (fallback policy '{policy}'): {why}",
            TurbineFallbackWarning,
            stacklevel=4,
        )


def first_line(error: BaseException) -> str:
    """An error's first line, for messages that name why something ran where it did."""
    text = str(error).strip()
    return text.splitlines()[0].rstrip(":") if text else type(error).__name__
