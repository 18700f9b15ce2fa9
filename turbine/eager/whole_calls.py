"""Whole torch calls on the vendor's kernels: the short way for a call whose ops all run there.

Every torch call on a DeviceTensor passes turbine's function mode (eager/mode.py) before torch's
dispatcher splits it into aten ops, each of which comes back into Python (``__torch_dispatch__``)
to be walked, planned and run. Where each of those ops runs on the vendor executor (torch's own
kernel over the device memory, the GPU's timed choice for most small ops), that trip buys
nothing: the same torch call on torch tensors over the same memory runs the same kernels. On the
H100 the trip was about two thirds of a chained small add's time (benchmarks/results/gpu-h100.md:
19.6 us per add for the least a ``__torch_dispatch__`` subclass can do, 8.9 us for torch).

So the mode hands such calls here. A call is known by its key: the function, each DeviceTensor
argument's layout and device, and the value of every other argument. The first call of a key
runs the usual way while dispatch notes how each of its ops ran (:func:`note_route`,
:func:`note_plan`). If every op was a view or an op whose timed plan chose the vendor, and the
result is a new dense tensor, later calls of the key run whole: torch's function on torch tensors
over the arguments' memory, ordered as the vendor executor orders its ops, the result adopted as
the vendor's results are. Any other way an op ran keeps the key on the usual way: a registry
handler (index checks, random numbers drawn on the host, data movement), IREE's kernel, a
fallback, a write into an argument, a view as the result. A key whose plans are still being timed
is learnt again at its next call.

The usual way is kept whenever the whole call would skip something: autograd must record (grad
mode on and an argument requires grad), forward-mode AD or a dispatch mode is active, autocast is
on, a ``turbine.profile()`` runs, or ``TURBINE_EXECUTORS=iree``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.autograd import forward_ad

from turbine.config import config
from turbine.counters import counters
from turbine.device import Device
from turbine.eager import executors, profiling, runtime
from turbine.eager.executors import vendor
from turbine.eager.executors.torch_kernel import TorchBuffer, adopt
from turbine.eager.plans import ViewPlan
from turbine.eager.tensor import DeviceTensor
from turbine.eager.timed_plan import TimedPlan
from turbine.errors import DeviceError

#: Arguments other than DeviceTensors that a key holds by value (each with its type: ``1`` and
#: ``True`` hash alike but promote differently).
_PLAIN = frozenset((int, float, bool, complex, str, type(None), torch.dtype, torch.memory_format, torch.layout))

#: Keys kept before the table is cleared (a loop over changing numbers makes a key per number).
LIMIT = 20000

#: Threads learning a key now: dispatch's notes cost one check of this number while it is 0.
observing = 0

_local = threading.local()
_observing_lock = threading.Lock()


class _Notes:
    """How the ops of a call being learnt ran: by the vendor's choice, some other way, or on a
    plan still being timed (then the call is learnt again next time)."""

    __slots__ = ("vendor", "other", "undecided")

    def __init__(self) -> None:
        self.vendor = 0
        self.other = 0
        self.undecided = False


def note_route(planned: bool) -> None:
    """Dispatch routed an op: ``planned`` if to a plan (or torch's decomposition into planned
    ops), not if to a registry handler or the foreach loop."""
    notes = getattr(_local, "notes", None)
    if notes is not None and not planned:
        notes.other += 1


def note_plan(plan: Any) -> None:
    """A plan is about to run one op of the call being learnt (noted before it runs: a timed
    plan's first call times both executors and returns IREE's results, though it may choose the
    vendor)."""
    notes = getattr(_local, "notes", None)
    if notes is None:
        return
    if type(plan) is TimedPlan:
        if plan.chosen == "vendor":
            notes.vendor += 1
        elif plan.chosen is None:
            notes.undecided = True
        else:
            notes.other += 1
    elif type(plan) is not ViewPlan:
        notes.other += 1


def call(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` for the mode, whose first argument is a DeviceTensor: whole on
    the vendor's kernels where its key has shown that every op of it runs there, else the usual
    way (learning the key if it is new)."""
    if observing and getattr(_local, "notes", None) is not None:
        return func(*args, **kwargs)  # a torch call inside a call being learnt: its ops are noted as that call's
    state = runtime.state
    storage = getattr(args[0], "_storage", None)  # None while torch builds a tensor (swap_tensors, Parameter)
    if storage is None or not _vendor_runs_on(storage.device) or func in state.not_whole or not _may_skip_dispatch():
        return func(*args, **kwargs)
    key = _key(func, args, kwargs)
    if key is None:
        return func(*args, **kwargs)
    verdicts = state.whole_calls
    verdict = verdicts.get(key)
    if verdict is None:
        return _learn(func, args, kwargs, key)
    if verdict is False:
        return func(*args, **kwargs)
    try:
        return _whole(func, args, kwargs, *verdict)
    except (DeviceError, torch.OutOfMemoryError):
        raise
    except Exception:  # torch's error in its own words: the usual way gives turbine's
        verdicts[key] = False
        return func(*args, **kwargs)


def _vendor_runs_on(device: Device) -> bool:
    """Whether the vendor executor may claim ops on ``device`` under the executors switch now
    (asked once per device and setting: on the CPU devices it does not by default, and their
    calls then pay one lookup here)."""
    asked = (device, config.executors)
    runs = _vendor_devices.get(asked)
    if runs is None:
        runs = _vendor_devices[asked] = executors.VENDOR.runs_on(device)
    return runs


_vendor_devices: dict[tuple, bool] = {}


def _may_skip_dispatch() -> bool:
    """Whether nothing that the usual way passes through is on: forward-mode AD, a dispatch
    mode, autocast, a profile."""
    return forward_ad._current_level < 0 and not _dispatch_modes() and not _autocast() and not profiling._active


# torch's questions, looked up once (every call on a DeviceTensor asks them).
_dispatch_modes = torch._C._len_torch_dispatch_stack
_autocast = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled


def _key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The call's key; None for a call that must take the usual way (an argument autograd
    records, tensors of two devices, an argument of a kind the key cannot hold)."""
    grad = _grad_enabled()
    key: list = [func]
    device = None
    for value in (*args, *kwargs.values()) if kwargs else args:
        kind = type(value)
        if kind is DeviceTensor:
            if grad and value.requires_grad:
                return None
            if device is None:
                device = value._storage.device
            elif value._storage.device is not device:
                return None
            key.append(value._key)
        elif kind in _PLAIN:
            key.append((kind, value))
        elif (kind is tuple or kind is list or kind is torch.Size) and all(type(v) is int for v in value):
            key.append((kind, tuple(value)))
        else:
            return None
    if device is None:
        return None
    if kwargs:
        key.append(tuple(kwargs))
    key.append(device)
    return tuple(key)


def _learn(func: Any, args: tuple, kwargs: dict, key: tuple) -> Any:
    """The call the usual way, noting how its ops ran; its key's verdict kept if decided."""
    global observing
    notes = _local.notes = _Notes()
    with _observing_lock:
        observing += 1
    try:
        result = func(*args, **kwargs)
    finally:
        _local.notes = None
        with _observing_lock:
            observing -= 1
    state = runtime.state
    if not isinstance(result, torch.Tensor) and not notes.vendor and not notes.other:
        state.not_whole.add(func)  # a size, a dtype, a test: no op to skip
        return result
    if notes.undecided:
        return result
    if len(state.whole_calls) >= LIMIT:
        state.whole_calls.clear()
    fresh = notes.vendor and not notes.other and _new_dense(result, args, kwargs)
    state.whole_calls[key] = (key[-1], notes.vendor) if fresh else False
    return result


def _new_dense(result: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``result`` is one dense DeviceTensor over memory torch's kernel made for it."""
    if type(result) is not DeviceTensor or not result._dense:
        return False
    buffer = result._storage.buffer
    if type(buffer) is not TorchBuffer:
        return False
    return all(buffer is not v._storage.buffer for v in (*args, *kwargs.values()) if type(v) is DeviceTensor)


def _whole(func: Any, args: tuple, kwargs: dict, device: Device, ops: int) -> DeviceTensor:
    """The call on torch tensors over the arguments' memory (the mode is off inside its own
    handler, so ``func`` goes straight to torch); its result a DeviceTensor, as the vendor's."""
    result, stream = vendor.call_torch(func, args, kwargs, device, func)
    counters.executors["vendor"] += ops
    return adopt(result, device, stream)
