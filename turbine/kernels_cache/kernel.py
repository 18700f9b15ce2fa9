"""A compiled kernel loaded on one device, called through its ``<function>$async`` entry point."""

from __future__ import annotations

import mmap
from typing import Callable

import iree.runtime as rt

from turbine.counters import counters
from turbine.device import Buffer, Device, failures, streams
from turbine.errors import CompileError


class LoadedModule:
    """A compiled module instantiated in its own VM context on a device.

    Instantiating costs 60-120 us on turbine:cpu (IREE loads the module's executables), so a
    bundle of kernels (bundles.py) is loaded once and its kernels share it.
    """

    __slots__ = ("context", "module")

    def __init__(self, device: Device, vmfb: bytes | memoryview) -> None:
        device.require_usable()
        self.module = _mapped(device, vmfb) or rt.VmModule.copy_buffer(device.instance, vmfb)
        try:
            self.context = rt.VmContext(device.instance, [device.hal_module, self.module])
        except IndexError as error:  # IREE's OUT_OF_RANGE: a limit of the runtime, not a device fault
            # (IREE 3.13 compiles a dispatch with more than 64 push constants, then refuses it)
            raise CompileError(f"IREE compiled the kernel but cannot load it: {str(error).strip().splitlines()[0]}") from None
        except RuntimeError as error:
            raise failures.failure(device, error, "loading a kernel") from error


def _mapped(device: Device, vmfb: bytes | memoryview) -> rt.VmModule | None:
    """A module run from the file mapping it was read from (a bundle: store.py), without a copy;
    None for other buffers, and for a module that does not start 64 bytes aligned there (IREE's
    requirement; entries written before the store aligned modules)."""
    if not (isinstance(vmfb, memoryview) and isinstance(vmfb.obj, mmap.mmap)):
        return None
    try:
        return rt.VmModule.wrap_buffer(device.instance, vmfb)
    except ValueError:
        return None


class Kernel:
    """One function of a loaded module (its own, or a bundle's) on a device.

    ``<function>$async`` (``main$async`` in a module of one kernel) takes the input buffer views
    plus a wait fence and a signal fence: the device starts the work when the inputs are ready
    and the host returns at once.

    IREE may hand back an input's buffer as a result, after writing into it (a scatter updates
    its input in place: iree-org/iree#16168). Callers rely on inputs never changing, so the
    first call runs on device-side copies of every input and records which inputs came back as
    results (``tied``); later calls copy just those inputs. Which inputs are tied is fixed when
    the module is compiled, so one probe per module is enough: the kernel cache keeps its
    answer (``on_probe``) and hands it to kernels loaded later.
    """

    __slots__ = ("device", "metadata", "context", "function", "tied", "on_probe", "waits_on_host")

    def __init__(
        self,
        device: Device,
        loaded: LoadedModule,
        function: str = "main",
        metadata: dict | None = None,
        tied: list[int] | None = None,
    ) -> None:
        self.device = device
        #: What the caller stored with the kernel (the eager layer: its output layouts).
        self.metadata = metadata or {}
        self.context = loaded.context
        self.function = loaded.module.lookup_function(f"{function}$async")
        if self.function is None:
            raise RuntimeError(f"compiled module has no {function}$async entry point")
        self.tied: tuple[int, ...] | None = None if tied is None else tuple(tied)
        #: Told the probe's answer once it is known.
        self.on_probe: Callable[[tuple[int, ...]], None] | None = None
        #: Whether the host waits for the inputs before each call: a kernel with dynamic dims records
        #: its work at each call, over result buffers that IREE allocates once the inputs are ready,
        #: and recording before then failed ("transient buffer has not been committed").
        self.waits_on_host = bool(self.metadata.get("dynamic"))

    def invoke(
        self, inputs: list[rt.HalBufferView], wait: rt.HalFence, signal: rt.HalFence
    ) -> tuple[rt.VmVariantList, rt.HalFence]:
        """Enqueue the kernel; returns the VM list of result buffer views and the fence they are ready at.

        When inputs were copied, that fence also waits for the copies: a kernel that hands an
        input straight back as its result does no work and may signal before the copy lands.
        """
        if self.tied == ():  # the common case: no input comes back as a result
            return self._call(inputs, wait, signal), signal
        probing = self.tied is None
        copied = range(len(inputs)) if probing else self.tied
        inputs = list(inputs)
        fences = []
        for index in copied:
            inputs[index], copy_ready = self._copy(inputs[index], wait)
            fences.append(copy_ready)
        wait = rt.HalFence.join(fences) if fences else wait
        ready = rt.HalFence.join([signal, wait]) if fences else signal
        results = self._call(inputs, wait, signal)
        if probing:
            outputs = [results.get_as_object(i, rt.HalBufferView).get_buffer() for i in range(results.size)]
            self.tied = tuple(i for i, view in enumerate(inputs) if view.get_buffer() in outputs)
            if self.on_probe is not None:
                self.on_probe(self.tied)
        return results, ready

    def launch(self, views: list[rt.HalBufferView], wait: rt.HalFence) -> list[tuple[Buffer, rt.HalBufferView]]:
        """Enqueue the kernel on ``views`` after ``wait``, with a fresh signal fence; no host wait.

        Returns each result as a Buffer (ready when the kernel is done) with its buffer view.
        """
        device = self.device
        device.require_usable()  # before the fence: its semaphore is made on the device's context
        stream = streams.current(device) if streams.entered else None
        if stream is not None:
            wait = stream.ordered(wait)
        results, ready = self.invoke(views, wait, device.new_fence())
        device.launched(ready)
        if stream is not None:
            stream.last = ready
        counters.dispatches += 1
        outputs = [results.get_as_object(index, rt.HalBufferView) for index in range(results.size)]
        return [(Buffer(device, view.get_buffer(), ready, view.byte_length), view) for view in outputs]

    def _call(self, inputs: list[rt.HalBufferView], wait: rt.HalFence, signal: rt.HalFence) -> rt.VmVariantList:
        """One call of the entry point: the inputs, then the wait and signal fences (on a device
        whose waits poll, a wait fence reached first: the call may block on it, device.py)."""
        device = self.device
        device.require_usable()
        if device.polls_waits or self.waits_on_host:
            device.settle(wait)
        args = rt.VmVariantList(len(inputs) + 2)
        for view in inputs:
            args.push_ref(view)
        args.push_ref(wait)
        args.push_ref(signal)
        results = rt.VmVariantList(4)
        try:
            self.context.invoke(self.function, args, results)
        except RuntimeError as error:
            raise failures.failure(device, error, "running a kernel") from error
        return results

    def _copy(self, view: rt.HalBufferView, wait: rt.HalFence) -> tuple[rt.HalBufferView, rt.HalFence]:
        """A device-side copy of an input enqueued after ``wait``, and the fence it signals."""
        source = view.get_buffer()
        copy = self.device.allocate(source.byte_length())
        done = self.device.new_fence()
        self.device.hal.queue_copy(source, copy, wait, done)
        return rt.HalBufferView(copy, list(view.shape), view.element_type), done
