"""torch-facing layer: DeviceTensor, the device-string mode, op dispatch, lowering, views."""

from turbine.eager.backend import register
from turbine.eager.tensor import DeviceTensor

register()

from turbine.eager.mode import install  # noqa: E402

install()

__all__ = ["DeviceTensor"]
