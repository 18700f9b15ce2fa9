"""What an executor is: who runs an op's calls on a device, and at what cost."""

from __future__ import annotations

import abc
from typing import Any

from turbine.device import Device


class Executor(abc.ABC):
    """One way to run an op on a turbine device.

    ``cost`` answers whether the executor can run ``func`` on ``device`` (None: it cannot) and
    how dear it is against the others (the IREE kernel is 1); the cheapest that claims an op runs
    it. ``run`` runs one call; the IREE executor runs calls through kernel plans instead
    (eager/executors/iree.py), built once per signature.
    """

    #: Short name, as ``turbine.stats()["executors"]`` and the coverage report count it.
    name: str
    #: What it does, in words for warnings and ``python -m turbine explain``.
    description: str

    @abc.abstractmethod
    def cost(self, func: Any, device: Device | None) -> float | None:
        """The relative cost of running ``func``'s calls on ``device``; None where it cannot."""

    def run(self, func: Any, args: tuple, kwargs: dict, device: Device | None) -> Any:
        """Run one call of ``func``; results are DeviceTensors on ``device``."""
        raise NotImplementedError(f"the {self.name} executor runs calls through its plans")

    def __repr__(self) -> str:
        return f"<{self.name} executor: {self.description}>"
