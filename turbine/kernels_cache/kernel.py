"""A compiled kernel loaded on one device, called through its ``main$async`` entry point."""

from __future__ import annotations

import iree.runtime as rt

from turbine.device import Device


class Kernel:
    """One compiled module in its own VM context on a device.

    ``main$async`` takes the input buffer views plus a wait fence and a signal fence: the device
    starts the work when the inputs are ready and the host returns at once.
    """

    __slots__ = ("device", "vmfb", "context", "function", "num_results")

    def __init__(self, device: Device, vmfb: bytes) -> None:
        self.device = device
        self.vmfb = vmfb
        module = rt.VmModule.copy_buffer(device.instance, vmfb)
        self.context = rt.VmContext(device.instance, [device.hal_module, module])
        self.function = module.lookup_function("main$async")
        if self.function is None:
            raise RuntimeError("compiled module has no main$async entry point")

    def invoke(self, inputs: list[rt.HalBufferView], wait: rt.HalFence, signal: rt.HalFence) -> rt.VmVariantList:
        """Enqueue the kernel; returns the VM list of result buffer views."""
        args = rt.VmVariantList(len(inputs) + 2)
        for view in inputs:
            args.push_ref(view)
        args.push_ref(wait)
        args.push_ref(signal)
        results = rt.VmVariantList(4)
        self.context.invoke(self.function, args, results)
        return results
