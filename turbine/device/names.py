"""Parsing turbine device names such as ``turbine:cuda0`` or ``turbine:cpu:sync``.

Grammar: ``turbine[:<kind>[<ordinal>][:sync]]`` or ``turbine:<torch index>``. Kinds are
``cpu`` (IREE local-task, or local-sync with ``:sync``), ``cuda``, ``hip`` and ``vulkan``.
Two CPU ordinals are two separate IREE devices, which lets CI test cross-device rules.
"""

from __future__ import annotations

import dataclasses
import re

from turbine.errors import DeviceNotFoundError

#: IREE HAL driver of each device kind.
DRIVERS = {"cpu": "local-task", "cpu:sync": "local-sync", "cuda": "cuda", "hip": "hip", "vulkan": "vulkan"}

_NAME = re.compile(r"^turbine(?::(?P<kind>cpu|cuda|hip|vulkan)(?P<ordinal>\d*)(?P<sync>:sync)?|:(?P<index>\d+))?$")


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A parsed name. ``kind`` is None for plain ``turbine`` (the current device) and for an index."""

    kind: str | None
    ordinal: int = 0
    sync: bool = False
    torch_index: int | None = None

    @property
    def driver(self) -> str:
        return DRIVERS["cpu:sync" if self.sync else self.kind]

    @property
    def canonical(self) -> str:
        """The one name a device prints as: ``turbine:cpu``, ``turbine:cpu1``, ``turbine:cuda0``."""
        if self.kind == "cpu":
            base = "turbine:cpu" if self.ordinal == 0 else f"turbine:cpu{self.ordinal}"
            return base + (":sync" if self.sync else "")
        return f"turbine:{self.kind}{self.ordinal}"


def parse(name: str) -> DeviceSpec:
    """Parse a device name, raising DeviceNotFoundError with the accepted forms when it is malformed."""
    text = name.strip()
    if not text.startswith("turbine"):
        text = "turbine:" + text
    match = _NAME.match(text)
    if match is None:
        raise DeviceNotFoundError(
            f"Invalid turbine device name {name!r}. Expected 'turbine', 'turbine:cpu', 'turbine:cpu1', "
            "'turbine:cpu:sync', 'turbine:cuda<N>', 'turbine:hip<N>', 'turbine:vulkan<N>' or 'turbine:<index>'."
        )
    if match["index"] is not None:
        return DeviceSpec(kind=None, torch_index=int(match["index"]))
    kind = match["kind"]
    if kind is None:
        return DeviceSpec(kind=None)
    if match["sync"] and kind != "cpu":
        raise DeviceNotFoundError(f"Invalid turbine device name {name!r}: only cpu devices have a ':sync' form.")
    return DeviceSpec(kind=kind, ordinal=int(match["ordinal"] or 0), sync=bool(match["sync"]))
