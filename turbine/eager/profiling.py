"""``turbine.profile()``: a per-op table of what a block of code ran, and where the time went.

While a profile is on, each aten op that reaches a turbine device waits for its own results
before the next starts (as ``TURBINE_LAUNCH_BLOCKING`` does), so the time of an op is its own:
``host`` is turbine's dispatch until the op returned, ``device`` the wait for its results after
that (kernels still compiling included), ``compile`` the compiles it caused, ``executors`` the
kernel launches and other executors' ops it made (gathering a view for it is a launch too),
``fallbacks`` the ops it sent to the fallback. Ops that turbine runs as several (a composite, a
fallback's copies) count once, under the op the program called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import threading
import time
from typing import Any, Callable, Iterator

from turbine.counters import counters
from turbine.eager.tensor import DeviceTensor


@dataclasses.dataclass
class OpRow:
    """One op's totals over a profile."""

    op: str
    calls: int = 0
    host_s: float = 0.0
    device_s: float = 0.0
    compiles: int = 0
    compile_s: float = 0.0
    executors: dict[str, int] = dataclasses.field(default_factory=dict)
    fallbacks: int = 0

    @property
    def total_s(self) -> float:
        return self.host_s + self.device_s


_COLUMNS = ("op", "calls", "total ms", "host ms", "device ms", "compiles", "compile s", "executors", "fallbacks")


class Profile:
    """The rows of one profile, heaviest first; prints as a table, and renders as one in a notebook."""

    def __init__(self) -> None:
        self.rows: dict[str, OpRow] = {}
        self._lock = threading.Lock()

    def sorted_rows(self) -> list[OpRow]:
        return sorted(self.rows.values(), key=lambda row: -row.total_s)

    def _cells(self, row: OpRow) -> list[str]:
        executors = ", ".join(f"{name} {count}" for name, count in sorted(row.executors.items()))
        return [
            row.op, str(row.calls), f"{row.total_s * 1e3:.2f}", f"{row.host_s * 1e3:.2f}", f"{row.device_s * 1e3:.2f}",
            str(row.compiles), f"{row.compile_s:.2f}", executors or "-", str(row.fallbacks),
        ]

    def table(self) -> str:
        """The rows as a plain-text table (what ``print`` shows)."""
        lines = [list(_COLUMNS)] + [self._cells(row) for row in self.sorted_rows()]
        widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
        text = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))) for line in lines]
        return "\n".join([text[0], "  ".join("-" * w for w in widths), *text[1:]])

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"turbine.Profile({len(self.rows)} ops)\n{self.table()}"

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in self._cells(row)) + "</tr>"
            for row in self.sorted_rows()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def record(self, op: str, host_s: float, device_s: float, before: dict, after: dict) -> None:
        with self._lock:
            row = self.rows.setdefault(op, OpRow(op))
            row.calls += 1
            row.host_s += host_s
            row.device_s += device_s
            row.compiles += after["kernels_compiled"] - before["kernels_compiled"]
            row.compile_s += after["compile_seconds"] - before["compile_seconds"]
            for name, count in after["executors"].items():
                ran = count - before["executors"].get(name, 0)
                if ran:
                    row.executors[name] = row.executors.get(name, 0) + ran
            row.fallbacks += sum(after["fallbacks"].values()) - sum(before["fallbacks"].values())


_active: list[Profile] = []
_depth = threading.local()


def _outputs(result: Any) -> list[DeviceTensor]:
    leaves = result if isinstance(result, (list, tuple)) else [result]
    return [t for t in leaves if isinstance(t, DeviceTensor)]


def _profiled(dispatch: Callable) -> Callable:
    def profiled_dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
        depth = getattr(_depth, "value", 0)
        if depth or not _active:
            return dispatch(func, args, kwargs)
        _depth.value = 1
        try:
            before = counters.snapshot()
            start = time.perf_counter()
            result = dispatch(func, args, kwargs)
            returned = time.perf_counter()
            for tensor in _outputs(result):
                tensor._storage.buffer.wait()
            done = time.perf_counter()
        finally:
            _depth.value = 0
        _active[-1].record(str(func), returned - start, done - returned, before, counters.snapshot())
        return result

    profiled_dispatch.unprofiled = dispatch  # type: ignore[attr-defined]
    return profiled_dispatch


@contextlib.contextmanager
def profile() -> Iterator[Profile]:
    """Profile the ops run in the block (any thread): ``with turbine.profile() as p: ...`` then
    ``print(p)``. Ops wait for their results one by one meanwhile, so the block runs slower."""
    found = Profile()
    if not _active:
        DeviceTensor.dispatcher = _profiled(DeviceTensor.dispatcher)
    _active.append(found)
    try:
        yield found
    finally:
        _active.remove(found)
        if not _active:
            DeviceTensor.dispatcher = DeviceTensor.dispatcher.unprofiled


__all__ = ["OpRow", "Profile", "profile"]
