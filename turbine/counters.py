"""Counters behind ``turbine.stats()``: what ran where, and every byte that crossed to the host.

Kept as plain module-level state so the hot dispatch path pays one attribute add per event.
"""

from __future__ import annotations

import collections
import html
from typing import Any

_NAMES = (
    "kernels_compiled",
    "compile_failures",
    "cache_hits_memory",
    "cache_hits_disk",
    "bundles_loaded",
    "plans_from_disk",
    "dispatches",
    "host_transfers",
    "host_transfer_bytes",
    "scalar_uploads",
    "check_reports",
    "device_copies",
    "deferred_launches",
    "compile_seconds",
    "graph_replays",
    "executor_timings",
)


class Counters:
    """Mutable event counts; ``fallbacks`` and ``host_ops`` count per op name."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        for name in _NAMES:
            setattr(self, name, 0)
        self.fallbacks: collections.Counter[str] = collections.Counter()
        #: Ops torch runs on host copies by design (random ops, so seeds give torch's numbers).
        self.host_ops: collections.Counter[str] = collections.Counter()
        #: Ops run by an executor other than IREE's kernels, per executor ("torch", "host").
        self.executors: collections.Counter[str] = collections.Counter()

    def snapshot(self) -> dict[str, Any]:
        data: dict[str, Any] = {name: getattr(self, name) for name in _NAMES}
        data["fallbacks"] = dict(self.fallbacks)
        data["host_ops"] = dict(self.host_ops)
        data["executors"] = {"iree": self.dispatches, **self.executors}
        return data


counters = Counters()


class Stats(dict):
    """``turbine.stats()``: a plain dict of the counters, which renders as a table in a notebook."""

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(str(name))}</td><td>{html.escape(_shown(value))}</td></tr>" for name, value in self.items()
        )
        return f"<table><tbody>{rows}</tbody></table>"


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def stats() -> dict[str, Any]:
    """A copy of the counters.

    ``host_transfers`` / ``host_transfer_bytes`` count tensor data that crossed between host and
    device (uploads and reads); ``scalar_uploads`` counts the 0-d buffers made for Python scalars
    that kernels take as runtime arguments, which are launch parameters rather than tensor data.
    ``deferred_launches`` counts ops that returned while their kernel was still compiling;
    ``compile_seconds`` adds up the compiles' wall times; ``graph_replays`` the CUDA graphs
    ``turbine.graphed`` functions replayed (their ops are not counted one by one);
    ``executor_timings`` the signatures timed on both executors to choose one.
    ``executors`` counts what ran per executor: ``iree`` its kernel launches (``dispatches``),
    ``vendor`` the ops torch's kernels ran by choice, the others (``torch``, ``host``) the ops
    the fallback policy gave them.
    """
    return Stats(counters.snapshot())


def reset_stats() -> None:
    """Zero every counter."""
    counters.reset()
