"""The torch-kernel executor: torch's own kernel over the device memory, shared through DLPack.

torch's CPU kernels for ``turbine:cpu*``, torch's CUDA kernels for ``turbine:cuda*`` where torch
has CUDA; no byte is copied either way where IREE and torch accept each other's memory. It is
the ``device`` fallback policy's executor, and the base of the GPU vendor executor (vendor.py).

Sharing costs about 20 us a buffer each way on an H200 (DLPack capsules, IREE's import), so a
buffer's torch tensor is made once and kept with it, and a result torch computed stays torch's
memory until IREE needs it (:class:`TorchBuffer`): a torch op that reads it next takes it as it
is, ordered by torch's stream, with no host wait.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from turbine.device import Buffer, Device, export_capsule, failures, import_capsule
from turbine.eager import host
from turbine.eager.dtypes import ELEMENT_TYPES, STORAGE_ONLY
from turbine.eager.executors.base import Executor
from turbine.eager.tensor import DenseLayout, DeviceTensor
from turbine.eager.tensor import torch_device as turbine_device


class TorchKernel(Executor):
    name = "torch"
    description = "torch's kernel over the device memory"

    def cost(self, func: Any, device: Device | None) -> float | None:
        """Torch runs on the CPU devices, and on CUDA ones where this torch has CUDA."""
        if device is None or device.kind == "cpu":
            return 2.0
        return 2.0 if device.kind == "cuda" and torch.cuda.is_available() else None

    def run(self, func: Any, args: tuple, kwargs: dict, device: Device | None) -> Any:
        """torch's kernel over shared memory; an argument the op writes is first cloned by torch (on
        the device) and the clone written back, so no buffer turbine handed out changes under it."""

        def shared(tensor: DeviceTensor, written: bool) -> torch.Tensor:
            result = shared_view(tensor)
            return result.clone() if written else result

        usable(device)
        try:
            result = host.run_with_torch(func, args, kwargs, shared, lambda result: adopt(result, device), torch_device(device))
        except Exception as error:
            raise_if_lost(error, device, func)
            raise
        finish_reads(host.device_tensors(args, kwargs))
        return result


def usable(device: Device) -> None:
    """Before a torch kernel over ``device``'s memory: a device already lost says so."""
    if device.lost is not None:
        raise failures.lost(device)


def raise_if_lost(error: Exception, device: Device, func: Any) -> None:
    """After torch's kernel on ``device`` raised ``error``: if it says the GPU context is lost (a
    kernel faulted, IREE's or torch's), the device is marked lost and that is raised, so that every
    later use says so plainly (device/failures.py) rather than torch failing each later op in its
    own words. (torch's CPU kernels never speak of CUDA errors, so the device's kind need not be
    asked.) Plain code at each call, not a context manager: this is on every vendor op's path."""
    if failures.context_lost(error):
        raise failures.failure(device, error, f"running {func} on torch's kernel") from error


def torch_device(device: Device) -> torch.device:
    """The torch device whose kernels run on ``device``'s memory."""
    return torch.device("cuda", device.spec.ordinal) if device.kind == "cuda" else torch.device("cpu")


class TorchBuffer(Buffer):
    """A result torch computed, left in torch's memory until IREE needs it.

    ``shared`` is the torch tensor (dense; complex as its real parts). Reading ``hal`` (a kernel's
    input, a read, a copy) first waits for torch's stream, then imports the memory through DLPack
    without a copy; torch ops that read it meanwhile use ``shared`` directly. ``stream`` is the
    torch stream that made it, as torch's (id, device index, device type) key (:func:`_stream_key`).
    """

    __slots__ = ("_hal", "stream")

    def __init__(
        self, device: Device, tensor: torch.Tensor, stream: tuple[int, int, int] | None = None, nbytes: int | None = None
    ) -> None:
        self.device = device
        self.shared = tensor
        self.nbytes = tensor.numel() * tensor.element_size() if nbytes is None else nbytes
        device.memory.held(self.nbytes)
        self.stream = (stream or _stream_key(tensor)) if tensor.is_cuda else None
        self._hal = self.reader = None

    def wait(self) -> None:
        """Block the host until torch's stream finished the tensor."""
        if self.stream is not None:
            _stream(self.stream).synchronize()
            self.stream = None

    @property
    def ready(self) -> None:
        """Never an IREE fence: ``hal`` waits for torch before IREE sees the memory."""
        return None

    @ready.setter
    def ready(self, fence: Any) -> None:
        if fence is not None:
            raise ValueError("a torch result's buffer has no IREE fence")

    @property
    def hal(self) -> Any:
        if self._hal is None:
            self.wait()  # IREE reads it on its own streams
            try:
                self._hal = import_capsule(self.device, torch.utils.dlpack.to_dlpack(self.shared))[0].hal
            except Exception:  # IREE refuses the pointer (misaligned): a fresh torch copy it accepts
                self.shared = self.shared.clone()
                self._hal = import_capsule(self.device, torch.utils.dlpack.to_dlpack(self.shared))[0].hal
        return self._hal


def current_stream(device: Device) -> tuple[int, int, int] | None:
    """The calling thread's torch stream on ``device``'s GPU, as a key (None on the CPU devices):
    an op's torch kernel runs there. Taken once per op and handed to the calls below."""
    return torch._C._cuda_getCurrentStream(device.spec.ordinal) if device.kind == "cuda" else None


#: Above zero while ``turbine.graphed`` captures a CUDA graph (eager/graphs.py): the capture began
#: after the device synchronized, so memory made on another stream needs no wait (a wait on a
#: stream outside the capture is not allowed inside it), and the storages read are noted.
capturing = 0

#: The storages whose memory torch kernels read during the capture (eager/graphs.py).
captured_reads: list = []


def shared_view(tensor: DeviceTensor, stream: tuple[int, int, int] | None = None) -> torch.Tensor:
    """A torch tensor (CPU or CUDA) over the same memory as ``tensor``, once its producer finished
    (on the calling thread's torch stream, ``stream`` if the caller has its key, for a tensor
    torch made)."""
    storage = tensor._storage
    if capturing:
        captured_reads.append(storage)
    buffer = storage.buffer
    whole = buffer.shared
    if whole is None:
        parts = STORAGE_ONLY.get(storage.dtype)
        count = storage.numel * (2 if parts else 1)
        whole = buffer.shared = torch.from_dlpack(export_capsule(buffer, count, ELEMENT_TYPES[parts or storage.dtype]))
    elif type(buffer) is TorchBuffer and buffer.stream is not None:
        current = stream or _stream_key(whole)
        if current != buffer.stream and not capturing:
            _stream(current).wait_stream(_stream(buffer.stream))
    if tensor._dense and whole.shape == tensor._key[0]:
        return whole  # the common case: the buffer's view was kept in this shape (never complex: see below)
    parts = STORAGE_ONLY.get(storage.dtype)  # complex storage crosses DLPack as its real parts (twice the numbers)
    if parts:
        return torch.view_as_complex(whole.view(-1, 2)).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
    if tensor._dense and whole.numel() == storage.numel:  # the whole buffer in the tensor's shape,
        if whole.shape != tensor._key[0]:  # kept as the buffer's view for the next read
            whole = buffer.shared = whole.view(tensor._key[0])
        return whole
    return whole.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def finish_reads(inputs: list[DeviceTensor], stream: tuple[int, int, int] | None = None) -> None:
    """Keep IREE's memory that a torch kernel read until torch's streams have read it.

    torch frees a DLPack view's memory (hands the buffer back to IREE) as soon as the view dies,
    whatever its stream still has to read, and IREE may then give the memory to its next result:
    so each IREE buffer a torch kernel read on a GPU notes the streams that read it
    (:class:`TorchReads`), and as it dies its memory waits for them (device/retired.py). Inputs
    that are torch's own memory need none: torch's allocator orders their reuse on its stream.
    ``stream``: the key of the stream that read them, if the caller has it.
    """
    for tensor in inputs:
        buffer = tensor._storage.buffer
        if type(buffer) is not TorchBuffer and tensor._storage.device.kind == "cuda":
            key = stream or _stream_key(buffer.shared)
            reads = buffer.reader
            if reads is None:
                buffer.reader = TorchReads(key)
            elif key not in reads.streams:
                reads.streams.append(key)


class TorchReads:
    """The torch streams that read an IREE buffer (their keys): as the buffer dies, an event on
    each, recorded then, marks the end of every read queued there (device/retired.py)."""

    __slots__ = ("streams", "_events")

    def __init__(self, stream: tuple[int, int, int]) -> None:
        self.streams = [stream]
        self._events: list[torch.cuda.Event] = []

    def retire(self) -> "TorchReads":
        """Mark the streams' current ends (the buffer is dying: no read comes after)."""
        for key in self.streams:
            event = torch.cuda.Event()
            event.record(_stream(key))
            self._events.append(event)
        return self

    def query(self) -> bool:
        return all(event.query() for event in self._events)

    def synchronize(self) -> None:
        for event in self._events:
            event.synchronize()


def _stream_key(tensor: torch.Tensor) -> tuple[int, int, int]:
    """The calling thread's current torch stream on ``tensor``'s GPU as torch keeps it, (stream id,
    device index, device type): a tuple is cheaper to get and compare than a Stream object, which
    is made (:func:`_stream`) only where a wait needs one."""
    return torch._C._cuda_getCurrentStream(tensor.device.index)


def _stream(key: tuple[int, int, int]) -> torch.cuda.Stream:
    """torch's Stream object for a stream key (kept: making one costs a few microseconds)."""
    stream = _streams.get(key)
    if stream is None:
        stream = _streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return stream


#: Stream objects by key (:func:`_stream`); a stream's key is not reused while torch runs.
_streams: dict[tuple[int, int, int], Any] = {}


def as_it_is(result: torch.Tensor) -> bool:
    """Whether a torch result's memory can be a turbine buffer as it is: dense from its start,
    real, no lazy negation (the common case)."""
    return result.dtype not in STORAGE_ONLY and result.is_contiguous() and not result.storage_offset() and not result.is_neg()


def adopt(result: torch.Tensor, device: Device, stream: tuple[int, int, int] | None = None) -> DeviceTensor:
    """A torch result as a DeviceTensor over the same memory (IREE takes it when it needs it);
    ``stream``: the key of the torch stream that made it, if the caller has it."""
    if as_it_is(result):
        layout = _layout(result.shape, result.dtype)
        return layout.make(TorchBuffer(device, result, stream, layout.nbytes), None, turbine_device(device))
    if result.is_conj() or result.is_neg():  # torch's lazy conj/neg bits, made real
        result = result.resolve_conj().resolve_neg()
    dense = result.contiguous()
    shared = torch.view_as_real(dense) if dense.dtype in STORAGE_ONLY else dense
    if shared.storage_offset():  # views of the buffer count their offsets from its start
        shared = shared.clone()
    return _layout(dense.shape, dense.dtype).make(TorchBuffer(device, shared, stream), None, turbine_device(device))


@functools.lru_cache(maxsize=4096)
def _layout(sizes: torch.Size, dtype: torch.dtype) -> DenseLayout:
    """The layout of a dense result of these sizes (kept: making one costs a microsecond)."""
    return DenseLayout(sizes, dtype)
