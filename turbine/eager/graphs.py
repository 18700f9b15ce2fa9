"""``turbine.graphed(fn)``: a function that runs on the vendor's kernels, replayed as one CUDA graph.

Each op of an eager step (an MLP's forward, backward and optimizer step) costs the host more than
a GPU takes to run a small kernel: torch CUDA itself is host-bound there, and turbine, which
dispatches every op through Python, more so (benchmarks/results/gpu-h100.md). Where every op of
a function runs on the vendor executor (torch's own kernels over the device memory, on torch's
stream), the whole function can be captured once as a CUDA graph and replayed with one launch.

How a call runs:

1. Warm-up: the first calls run eagerly on a side stream, single-threaded autograd, while the
   counters say whether anything besides the vendor ran (an IREE kernel, a host transfer, a
   random draw on the host, a fallback, a compile), and the mode notes each torch call's numbers.
   The first call (which makes the optimizer's state) and calls that compiled or timed kernels,
   or left compiles running, are not counted; a later call that ran IREE's kernels or touched
   the host, or two clean calls whose numbers differ
   (AdamW's bias corrections without ``capturable=True``, a schedule), leave the function eager
   for good, with the reason logged.
2. Capture: the next call runs under ``torch.cuda.graph`` on copies of its tensor arguments (a
   tensor that requires grad is used as it is, as a parameter). turbine's buffers are immutable,
   so an in-place op (the optimizer's update) puts a new buffer in its storage; at the end of the
   capture each such new value is copied into the storage's old buffer, and the old buffer put
   back, so the graph reads and writes the same memory at every replay.
3. Replay: each later call checks that every storage the graph read still holds the buffer it
   read (a parameter reassigned or updated outside, a loaded state dict, would take a capture
   again), copies its tensor arguments into the copies, replays the graph, and returns copies of
   its results. Buffers the graph writes are marked as made on its stream, so torch ops and IREE
   wait for the replay.

As with ``torch.cuda.graph``, a replay does not run Python: what the function does besides
torch ops (appending to a list, reading a Python number that changes after the warm-up, an
``lr_scheduler``'s new rate) is not seen. Numbers that change from one call to the next are found
in the warm-up and keep the function eager; put such numbers in tensors (``capturable=True`` for
torch's optimizers). On devices other than CUDA GPUs the function runs eagerly.
"""

from __future__ import annotations

import functools
import gc
import logging
from typing import Any, Callable, Iterator

import torch

from turbine.counters import counters
from turbine.device import Device
from turbine.eager import executors
from turbine.eager.executors import torch_kernel
from turbine.eager.executors.torch_kernel import TorchBuffer, adopt, finish_reads, shared_view
from turbine.eager.tensor import DeviceTensor, Storage
from turbine.kernels_cache import kernel_cache

log = logging.getLogger("turbine")

#: Counters that mean something besides the vendor executor ran.
_NOT_VENDOR = ("dispatches", "host_transfers", "scalar_uploads", "check_reports", "device_copies", "deferred_launches")

#: Counters that mean a warm-up call still compiled or timed kernels: another warm-up follows.
_SETTLING = ("kernels_compiled", "compile_failures", "deferred_launches", "executor_timings")

#: Calls whose torch calls are being noted (the mode's hook; None while nothing is noted).
notes: list | None = None


def note(func: Any, args: tuple, kwargs: dict | None) -> None:
    """The mode saw a torch call while a warm-up notes them: keep its numbers and layouts if it
    is the program's call on turbine tensors (turbine's own work on torch tensors, the profiler's
    markers, are not the function's numbers)."""
    if not _on_turbine(args) and not (kwargs and (_on_turbine(tuple(kwargs.values())) or _names_turbine(kwargs.get("device")))):
        return
    try:
        notes.append((func, _shape(args), _shape(kwargs) if kwargs else None))
    except TypeError:  # a value that cannot be compared (a closure): nothing to check
        notes.append((func, None, None))


def _on_turbine(values: tuple) -> bool:
    """Whether a DeviceTensor is among ``values`` or in a list among them."""
    for value in values:
        if type(value) is DeviceTensor:
            return True
        if isinstance(value, (list, tuple)) and any(type(v) is DeviceTensor for v in value):
            return True
    return False


def _names_turbine(device: Any) -> bool:
    return (isinstance(device, str) and device.startswith("turbine")) or (isinstance(device, torch.device) and device.type == "turbine")


def _shape(value: Any) -> Any:
    """A value as a graph depends on it: a DeviceTensor by layout and device, lists item by
    item, numbers and other plain values as they are."""
    if type(value) is DeviceTensor:
        return (value._key, value._storage.device)
    if isinstance(value, (list, tuple)):
        return tuple(_shape(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _shape(v)) for k, v in value.items())
    if isinstance(value, (int, float, bool, complex, str, type(None), torch.dtype, torch.device)):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    return ("object", id(value))


def graphed(fn: Callable | None = None, *, warmup: int = 2, max_warmup: int = 50) -> Callable:
    """``fn`` replayed as one CUDA graph once ``warmup`` clean eager calls agree (see the module
    docstring); usable as ``@turbine.graphed`` or ``turbine.graphed(step, warmup=3)``. The first
    call is never clean (it makes the optimizer's state); calls that compile or time kernels do
    not count, up to ``max_warmup`` calls in all."""
    if fn is None:
        return functools.partial(graphed, warmup=warmup, max_warmup=max_warmup)
    if warmup < 1:
        raise ValueError(f"turbine.graphed: warmup must be at least 1 (a capture needs the optimizer's state made), got {warmup}")
    return functools.wraps(fn)(Graphed(fn, warmup, max_warmup))


class Graphed:
    """The callable ``turbine.graphed`` returns: one capture per key of its arguments."""

    def __init__(self, fn: Callable, warmup: int, max_warmup: int) -> None:
        self.fn = fn
        self.warmup = warmup
        self.max_warmup = max_warmup
        self.eager_why: str | None = None  # why the function stays eager, once found
        self.captures: dict[tuple, Capture] = {}
        self.calls = 0
        self.clean: list[list] = []  # the noted torch calls of the clean warm-up calls
        self.device: Device | None = None  # the device of its tensors (found by the first call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager_why is not None:
            return self.fn(*args, **kwargs)
        device = self.device or _device_of(args, kwargs)
        if device is None:
            return self._find_device(args, kwargs)
        if device.kind != "cuda":
            self._stay_eager(f"its tensors are on {device.name}, not a CUDA GPU")
            return self.fn(*args, **kwargs)
        key = _key(args, kwargs)
        capture = self.captures.get(key)
        if capture is not None:
            if capture.still_reads():
                return capture.replay(args, kwargs)
            del self.captures[key]  # a storage it reads holds another buffer now: capture again
            self.clean.clear()
        if len(self.clean) < self.warmup:
            return self._warm_up(device, args, kwargs)
        return self._capture(device, key, args, kwargs)

    def _find_device(self, args: tuple, kwargs: dict) -> Any:
        """The first call of a function whose arguments hold no DeviceTensor: eager, noting its
        torch calls to find the device its tensors (the module's, the closure's) are on."""
        global notes
        self.calls += 1
        notes = noted = []
        try:
            result = self.fn(*args, **kwargs)
        finally:
            notes = None
        found = {d for call in noted for d in _devices(call)}
        if len(found) == 1:
            self.device = found.pop()
        else:
            self._stay_eager(f"its torch calls use {len(found)} turbine devices, not one")
        return result

    def _warm_up(self, device: Device, args: tuple, kwargs: dict) -> Any:
        global notes
        self.calls += 1
        stream = _side_stream(device)
        stream.wait_stream(torch.cuda.current_stream(device.spec.ordinal))
        before = counters.snapshot()
        notes = noted = []
        try:
            with torch.cuda.stream(stream), torch.autograd.set_multithreading_enabled(False):
                result = self.fn(*args, **kwargs)
        finally:
            notes = None
        torch.cuda.current_stream(device.spec.ordinal).wait_stream(stream)
        after = counters.snapshot()
        settling = [name for name in _SETTLING if after[name] > before[name]]
        if not kernel_cache.wait_for_compiles(timeout=0):
            settling.append("compiles pending")  # their plans time both executors when done
        others = {k: v - before["executors"].get(k, 0) for k, v in after["executors"].items() if k not in ("iree", "vendor")}
        not_vendor = [name for name in _NOT_VENDOR if after[name] > before[name]] + [f"{k} executor" for k, v in others.items() if v]
        if self.calls == 1 or settling:
            self.clean.clear()  # the optimizer's state made, kernels compiled or executors timed
        elif not_vendor:
            self._stay_eager(f"besides the vendor's kernels it ran: {', '.join(not_vendor)}")
        elif self.clean and self.clean[-1] != noted:
            self._stay_eager(f"its torch calls differ from one call to the next ({_first_difference(self.clean[-1], noted)})")
        else:
            self.clean.append(noted)
        if not self.eager_why and self.calls >= self.max_warmup and len(self.clean) < self.warmup:
            self._stay_eager(f"{self.calls} warm-up calls did not settle (kernels still compiling or being timed)")
        return result

    def _stay_eager(self, why: str) -> None:
        self.eager_why = why
        log.info("turbine.graphed(%s) runs eagerly: %s", getattr(self.fn, "__name__", self.fn), why)

    def _capture(self, device: Device, key: tuple, args: tuple, kwargs: dict) -> Any:
        capture = Capture(device)
        try:
            result = capture.record(self.fn, args, kwargs)
        except _Uncapturable as why:
            self._stay_eager(str(why))
            return self.fn(*args, **kwargs)
        if len(self.captures) >= 8:
            self.captures.clear()
        self.captures[key] = capture
        return result


class _Uncapturable(Exception):
    """What keeps a function from being captured (its message says what)."""


class Capture:
    """One CUDA graph of a function, the memory it reads and writes, and its results."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.stream = _side_stream(device)
        self.stream_key = (self.stream.stream_id, self.stream.device_index, self.stream.device_type)
        self.graph = torch.cuda.CUDAGraph()
        self.inputs: list[tuple[str | int, torch.Tensor]] = []  # (where, torch view of the copy)
        self.reads: list[tuple[Storage, Any]] = []  # storages read and the buffer each must hold
        self.written: list[TorchBuffer] = []  # buffers each replay writes
        self.outputs: Any = None

    def record(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """Capture ``fn`` on copies of its tensor arguments, then replay it once; returns its
        results (copies). Storages the capture gave new buffers get their old ones back, now
        holding the new values, whether or not the capture succeeded."""
        ordinal = self.device.spec.ordinal
        self.stream.wait_stream(torch.cuda.current_stream(ordinal))
        with torch.cuda.stream(self.stream):
            args, kwargs = self._static(args, kwargs)
        torch.cuda.synchronize(ordinal)
        before = _storages()
        counts = counters.snapshot()
        changed: list[tuple[Storage, Any]] = []
        try:
            with torch.autograd.set_multithreading_enabled(False), _capturing():
                with torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode="thread_local"):
                    outputs = fn(*args, **kwargs)
                    changed = [(s, old) for s, old in before.items() if s.buffer is not old]
                    for storage, old in changed:  # the new values into the memory the graph read
                        if type(old) is not TorchBuffer or type(storage.buffer) is not TorchBuffer:
                            raise _Uncapturable("a value it updates in place is not in torch's memory")
                        old.shared.view(-1).copy_(storage.buffer.shared.reshape(-1))
        except _Uncapturable:
            raise
        except Exception as error:
            raise _Uncapturable(f"its capture failed: {type(error).__name__}: {error}") from error
        finally:
            for storage, old in changed or [(s, old) for s, old in before.items() if s.buffer is not old]:
                storage.buffer = old
        ran = [name for name in _NOT_VENDOR if counters.snapshot()[name] > counts[name]]
        if ran:
            raise _Uncapturable(f"besides the vendor's kernels the capture ran: {', '.join(ran)}")
        read = {id(s): s for s in torch_kernel.captured_reads if s in before}
        torch_kernel.captured_reads.clear()
        self.reads = [(s, before[s]) for s in read.values()]
        self.written = [s.buffer for s in _storages() if s not in before and type(s.buffer) is TorchBuffer]
        self.written += [old for _, old in changed]
        self.outputs = outputs
        return self._launch()

    def _static(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Copies of the tensor arguments for the graph to read, in torch's memory (a tensor that
        requires grad is used as it is: autograd puts its gradient on it)."""

        def copy(where: str | int, value: Any) -> Any:
            if type(value) is not DeviceTensor or value.requires_grad:
                return value
            static = _copies(value, self.device, self.stream_key)
            self.inputs.append((where, shared_view(static, self.stream_key)))
            return static

        return tuple(copy(i, a) for i, a in enumerate(args)), {k: copy(k, v) for k, v in kwargs.items()}

    def still_reads(self) -> bool:
        """Whether every storage the graph reads still holds the buffer it read."""
        return all(storage.buffer is buffer for storage, buffer in self.reads)

    def replay(self, args: tuple, kwargs: dict) -> Any:
        """The graph on these arguments; copies of its results (detached: autograd ran inside)."""
        ordinal = self.device.spec.ordinal
        self.stream.wait_stream(torch.cuda.current_stream(ordinal))
        with torch.cuda.stream(self.stream):
            sources = []
            for where, static in self.inputs:
                value = args[where] if isinstance(where, int) else kwargs[where]
                sources.append(value)
                static.copy_(shared_view(value, self.stream_key))
            finish_reads(sources, self.stream_key)
        return self._launch()

    def _launch(self) -> Any:
        """Replay the graph on its stream; mark what it wrote as made there (torch ops wait for
        it, and IREE imports it again, waiting); copies of the results, which the next replay
        would overwrite."""
        ordinal = self.device.spec.ordinal
        self.stream.wait_stream(torch.cuda.current_stream(ordinal))
        with torch.cuda.stream(self.stream):
            self.graph.replay()
            counters.graph_replays += 1
            for buffer in self.written:
                buffer.stream = self.stream_key
                buffer._hal = None
            return _copies(self.outputs, self.device, self.stream_key)


def _copies(value: Any, device: Device, stream: tuple) -> Any:
    """Each DeviceTensor in ``value`` copied by torch on ``stream`` into new torch memory."""
    if type(value) is DeviceTensor:
        counters.executors[executors.VENDOR.name] += 1
        return adopt(shared_view(value, stream).clone(), device, stream)
    if type(value) in (list, tuple):
        return type(value)(_copies(v, device, stream) for v in value)
    if type(value) is dict:
        return {k: _copies(v, device, stream) for k, v in value.items()}
    return value  # a number, None; results inside other containers are the graph's own


def _storages() -> dict[Storage, Any]:
    """Every storage alive and the buffer it holds (a capture's before and after)."""
    return {obj: obj.buffer for obj in gc.get_objects() if type(obj) is Storage}


class _capturing:
    """Tells the torch-kernel executor that a capture runs (see ``torch_kernel.capturing``);
    the storages it read are ``torch_kernel.captured_reads`` until the next capture."""

    def __enter__(self) -> None:
        torch_kernel.captured_reads.clear()
        torch_kernel.capturing += 1

    def __exit__(self, *exc: Any) -> None:
        torch_kernel.capturing -= 1


def _device_of(args: tuple, kwargs: dict) -> Device | None:
    """The device of the first DeviceTensor argument, if any."""
    for value in (*args, *kwargs.values()):
        if type(value) is DeviceTensor:
            return value._storage.device
    return None


def _devices(value: Any) -> Iterator[Device]:
    """The devices in a noted call (its DeviceTensors' shapes are (layout key, Device))."""
    if isinstance(value, Device):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _devices(item)


def _key(args: tuple, kwargs: dict) -> tuple:
    """What picks a capture: tensors by layout (those that require grad by identity), other
    values as they are."""

    def one(value: Any) -> Any:
        if type(value) is DeviceTensor:
            return ("same", id(value)) if value.requires_grad else _shape(value)
        return _shape(value)

    return tuple(one(a) for a in args), tuple((k, one(v)) for k, v in kwargs.items())


_side_streams: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: Device) -> torch.cuda.Stream:
    """The stream graphed functions run on for ``device`` (a capture cannot run on the default one)."""
    stream = _side_streams.get(device.index)
    if stream is None:
        stream = _side_streams[device.index] = torch.cuda.Stream(device.spec.ordinal)
    return stream


def _key_of(stream: torch.cuda.Stream) -> tuple:
    return (stream.stream_id, stream.device_index, stream.device_type)


def _first_difference(one: list, other: list) -> str:
    for a, b in zip(one, other):
        if a != b:
            return f"{getattr(a[0], '__name__', a[0])} got {a[1:]} then {b[1:]}"
    return f"{len(one)} torch calls, then {len(other)}"
