"""torch-facing layer: DeviceTensor, the device-string mode, op dispatch, lowering, views."""

from turbine.eager import backend

backend.register()  # torch.device("turbine") exists from here on

from turbine.eager import backend_kernels, dispatch, dynamo_rules, mode  # noqa: E402
from turbine.eager.tensor import DeviceTensor  # noqa: E402

DeviceTensor.dispatcher = dispatch.handle
backend_kernels.register()
mode.install()
dynamo_rules.keep_dynamo_out(mode.DeviceMode.__torch_function__)

__all__ = ["DeviceTensor"]
