"""The host executor: torch's CPU kernel on host copies of the inputs, results copied back."""

from __future__ import annotations

from typing import Any

from turbine.device import Device
from turbine.eager import host
from turbine.eager.executors.base import Executor


class HostCopies(Executor):
    name = "host"
    description = "torch's CPU kernel on host copies"

    def cost(self, func: Any, device: Device | None) -> float | None:
        """Any op torch's CPU runs; every byte crosses twice (counted host transfers)."""
        return 10.0

    def run(self, func: Any, args: tuple, kwargs: dict, device: Device | None) -> Any:
        return host.run_on_host(func, args, kwargs, device)
