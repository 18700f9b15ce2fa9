"""torch-facing layer: DeviceTensor, the device-string mode, op dispatch, lowering, views."""

from turbine.eager.backend import register
from turbine.eager.tensor import DeviceTensor

register()

from turbine.eager.factories import register_backend_kernels  # noqa: E402
from turbine.eager.mode import install  # noqa: E402

register_backend_kernels()
install()

__all__ = ["DeviceTensor"]
