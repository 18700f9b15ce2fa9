"""The TorchFunctionMode that lets torch accept turbine device strings.

``torch.device("turbine:cuda0")`` cannot parse, but a TorchFunctionMode sees
``torch.ones(2, device="turbine:cuda0")`` and ``x.to("turbine:cpu")`` before torch parses the
device, so it routes them here. It is entered once at ``import turbine`` and stays active.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

from turbine.device import Device, open_device
from turbine.device.registry import by_index, current, opened_devices
from turbine.eager import backward_errors, conversion, dynamo_rules, factories, graphs, pinning, whole_calls
from turbine.eager.ops import bags, bounds, ctc
from turbine.eager.tensor import DeviceTensor
from turbine.eager.transfer import to_device


def turbine_device(value: Any) -> Device | None:
    """The Device a device argument names, or None when it is not a turbine device."""
    if isinstance(value, Device):
        return value
    if isinstance(value, str):
        return open_device(value) if value.startswith("turbine") else None
    if isinstance(value, torch.device) and value.type == "turbine":
        return current() if value.index is None else by_index(value.index)
    return None


def _torch_device(value: Any) -> Any:
    """A turbine device argument as the torch.device torch can parse; anything else unchanged."""
    if isinstance(value, (str, Device)):
        device = turbine_device(value)
        if device is not None:
            return torch.device("turbine", device.index)
    return value


def _parse_to(args: tuple, kwargs: dict) -> tuple[Any, torch.dtype | None, dict]:
    """The device and dtype of a ``Tensor.to`` call, and its other keyword arguments."""
    device = kwargs.get("device")
    dtype = kwargs.get("dtype")
    rest = {k: v for k, v in kwargs.items() if k not in ("device", "dtype")}
    for value in args:
        if isinstance(value, torch.dtype):
            dtype = value
        elif isinstance(value, (str, torch.device, Device)):
            device = value
        elif isinstance(value, torch.Tensor):
            device, dtype = value.device, value.dtype
    return device, dtype, rest


def _tensor_to(tensor: torch.Tensor, device: Device, dtype: torch.dtype | None, rest: dict) -> torch.Tensor:
    target = torch.device("turbine", device.index)
    source = tensor
    if isinstance(tensor, DeviceTensor):
        return torch.Tensor.to(tensor, target, dtype or tensor.dtype, **rest)
    if isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin):
        raise RuntimeError(
            f"turbine cannot move an uninitialized parameter of a lazy module to {device.name}: its shape is not "
            "known yet. Run the module once on a CPU batch (which sets its shapes), then move it with .to()."
        )
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if dtype is not None:
        tensor = tensor.to(dtype)
    memory_format = rest.get("memory_format", torch.preserve_format)
    if memory_format is not torch.preserve_format:
        tensor = tensor.contiguous(memory_format=memory_format)  # the upload keeps its order
    if tensor.requires_grad and torch.is_grad_enabled():
        # torch's own copy (empty + _copy_from on the turbine key) records ToCopyBackward, whose
        # backward brings the gradient back to the CPU as it does for CUDA.
        return torch.Tensor.to(tensor, target, memory_format=memory_format)
    moved = to_device(tensor, device)
    conversion.mark_for_swap(source, moved)
    return moved


def _shallow_copy_compatible(tensor: torch.Tensor, value: torch.Tensor) -> bool:
    """``torch._has_compatible_shallow_copy_type``, which ``Module._apply`` asks before it moves a
    parameter with ``param.data = value``: torch compares the two tensors' dispatch keys, and says
    no for a turbine parameter and a CPU value, which a turbine tensor's ``.data`` setter takes
    (eager/conversion.py)."""
    if isinstance(tensor, DeviceTensor) and type(value) in (torch.Tensor, torch.nn.Parameter) and value.device.type == "cpu":
        return True
    return torch._has_compatible_shallow_copy_type(tensor, value)


#: True while dynamo traces (torch.compile, strict torch.export), which reads it as a constant: the
#: rest of the mode's handler, whose set lookups dynamo cannot trace, is not traced there
#: (eager/dynamo_rules.py). torch.compiler.is_compiling would not do: it stays True for a whole
#: compile session and a non-strict export, where the handler runs eagerly.
_compiling = torch.compiler.is_dynamo_compiling

_TENSOR_TO = (torch.Tensor.to, torch.Tensor.cuda)
_PARSE_TO = torch._C._nn._parse_to
#: Calls that run autograd's backward: errors inside them are held until they return.
_BACKWARD = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
_SHALLOW_COPY_COMPATIBLE = torch._has_compatible_shallow_copy_type
_PIN = (torch.Tensor.pin_memory, torch.Tensor.is_pinned)
_ONE_HOT = torch.nn.functional.one_hot
_CTC_LOSS = (torch.nn.functional.ctc_loss, torch.ctc_loss)
_EMBEDDING_BAG = torch.nn.functional.embedding_bag
#: Checked on every torch call in the process: a set, so the check is one hash lookup.
_INTERCEPTED = frozenset((*_TENSOR_TO, _PARSE_TO, *_BACKWARD, _SHALLOW_COPY_COMPATIBLE, torch.device, *_PIN, _ONE_HOT, *_CTC_LOSS, _EMBEDDING_BAG))


def _device_object(*args: Any, **kwargs: Any) -> torch.device:
    """``torch.device("turbine:cpu")``: torch's device type plus index cannot spell a turbine
    device name, so the name opens its device and gives ``torch.device("turbine", k)``, its torch
    index (the nearest form torch allows); every other spelling is torch's own."""
    if len(args) == 1 and not kwargs and isinstance(args[0], str) and args[0].startswith("turbine:"):
        suffix = args[0].removeprefix("turbine:")
        if not suffix.isdigit():
            return torch.device("turbine", open_device(args[0]).index)
    return torch.device(*args, **kwargs)


class DeviceMode(TorchFunctionMode):
    """Routes calls that name a turbine device; every other call passes straight through.

    It sees every torch call in the process, so the common case (no device argument) is kept to
    two checks. It also wraps backward calls (eager/backward_errors.py), and hands calls on a
    DeviceTensor to eager/whole_calls.py, which runs them whole on the vendor's kernels where
    every op of them runs there.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if _compiling():  # torch.compile traces the handler: torch's own ops go in its graph,
            if not _names_turbine(args, kwargs):
                return func(*args, **(kwargs or {}))
            # a call that names a turbine device breaks it (dynamo runs a skipped function eagerly)
            return dynamo_rules.outside_dynamo(_route, func, args, kwargs)
        if dynamo_rules.in_compiled_function():  # the eager part of a compiled function
            on_turbine = bool(args) and type(args[0]) is DeviceTensor
            return dynamo_rules.outside_dynamo(_route, func, args, kwargs, turbine_tensors=on_turbine)
        return _route(func, args, kwargs)


def _route(func: Any, args: tuple, kwargs: dict | None) -> Any:
    """The mode's handling of a call, outside dynamo's tracing."""
    if graphs.notes is not None:  # a turbine.graphed warm-up notes every call's numbers
        graphs.note(func, args, kwargs)
    if not kwargs:
        if func not in _INTERCEPTED:
            if args and type(args[0]) is DeviceTensor:
                return whole_calls.call(func, args, {})
            return func(*args)
        kwargs = {}
    if func is _SHALLOW_COPY_COMPATIBLE:
        return _shallow_copy_compatible(*args)
    if func is torch.device:
        return _device_object(*args, **kwargs)
    if func is _ONE_HOT and isinstance(args[0] if args else kwargs.get("input"), DeviceTensor):
        return bounds.one_hot(*args, **kwargs)  # torch checks no class of a Python backend's
    if func in _CTC_LOSS and isinstance(args[0] if args else kwargs.get("log_probs"), DeviceTensor):
        return ctc.ctc_loss(func, *args, **kwargs)  # lengths as host numbers, as for torch's own tensors
    if func is _EMBEDDING_BAG and isinstance(args[1] if len(args) > 1 else kwargs.get("weight"), DeviceTensor):
        return bags.embedding_bag(*args, **kwargs)  # as ops IREE runs, above autograd
    if func in _PIN and pinning.for_turbine(args[1] if len(args) > 1 else kwargs.get("device")):
        # pinned memory is a C++ hook a Python backend cannot give (eager/pinning.py)
        return args[0].clone() if func is torch.Tensor.pin_memory else False
    if func in _BACKWARD:
        with backward_errors.collecting(), _autograd_threads_that_fit():
            return func(*args, **kwargs)
    if func in _TENSOR_TO:
        device, dtype, rest = _parse_to(args[1:], kwargs)
        target = turbine_device(device)
        if target is not None:
            return _tensor_to(args[0], target, dtype, rest)
    elif func is _PARSE_TO:
        # nn.Module.to parses its arguments here; hand it a device torch can parse.
        args = tuple(_torch_device(a) for a in args)
        kwargs = {k: _torch_device(v) for k, v in kwargs.items()}
    elif "device" in kwargs:
        target = turbine_device(kwargs["device"])
        if target is not None:
            made = factories.create(func, args, kwargs, target)
            if func is torch.empty_like:  # module.to_empty: keep shared parameters shared, as .to() does
                conversion.mark_for_swap(args[0], made)
            return made
    if args and type(args[0]) is DeviceTensor:
        return whole_calls.call(func, args, kwargs)
    return func(*args, **kwargs)


def _names_turbine(args: tuple, kwargs: dict | None) -> bool:
    """Whether a call names a turbine device (a factory's ``device=``, ``.to("turbine:cpu")``) or
    has a turbine tensor: written for dynamo to trace (eager/dynamo_rules.py)."""
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, str) and value.startswith("turbine"):
            return True
        if isinstance(value, (Device, DeviceTensor)) or (isinstance(value, torch.device) and value.type == "turbine"):
            return True
    return False


def _autograd_threads_that_fit() -> Any:
    """Autograd's device threads off for a backward call where they cannot serve every turbine
    device: torch keeps one worker queue per device index, as many as its device guards report
    devices, and the Python guard of a Python backend reports one. With turbine:cpu and
    turbine:cuda0 both open (torch indices 0 and 1) beside one CUDA GPU, a multi-threaded
    backward through index 1 failed torch's assert (engine.cpp, ``device_ready_queues_``).
    Single-threaded, the same backward runs every op on the calling thread, correctly."""
    if not torch.autograd.is_multithreading_enabled():
        return contextlib.nullcontext()
    queues = max(1, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if len(opened_devices()) <= queues:
        return contextlib.nullcontext()
    return torch.autograd.set_multithreading_enabled(False)


_mode = DeviceMode()


def install() -> None:
    """Enter the mode for the rest of the process (once): in this thread, and in every thread
    started from now on."""
    if not getattr(_mode, "_turbine_installed", False):
        enable_in_thread()
        _start_threads_with_the_mode()
        _mode._turbine_installed = True


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """torch as it runs without turbine, on this thread, meanwhile: the mode is taken off the
    thread's function-mode stack (it costs every torch call about a microsecond). Benchmarks time
    torch's side this way; turbine's device names are not understood inside."""
    stack = torch.overrides._get_current_function_mode_stack()
    if not stack or stack[-1] is not _mode:
        yield
        return
    popped = torch._C._pop_torch_function_stack()
    try:
        yield
    finally:
        torch._C._push_on_torch_function_stack(popped)


def enable_in_thread() -> None:
    """Let this thread name turbine devices by string (``device="turbine:cpu"``).

    torch keeps its function modes per thread, so a thread started before ``import turbine`` (a
    thread pool's worker, say) has not got turbine's; threads started later get it by
    themselves. Pass it as a pool's ``initializer`` or call it at the top of such a thread.
    Calling it again does nothing.
    """
    if not any(mode is _mode for mode in torch.overrides._get_current_function_mode_stack()):
        torch._C._push_on_torch_function_stack(_mode)


def _start_threads_with_the_mode() -> None:
    """Every Python thread started later enters the mode before its target runs.

    ``threading.Thread._bootstrap_inner`` is where each thread starts (a private method, the same
    from Python 3.8 to 3.13): it is wrapped once. Threads made from C or with ``_thread`` do not
    pass there and need :func:`enable_in_thread`.
    """
    start = threading.Thread._bootstrap_inner

    def bootstrap_inner(thread: threading.Thread) -> None:
        enable_in_thread()
        start(thread)

    threading.Thread._bootstrap_inner = bootstrap_inner
