"""Plans kept on disk, so that a new process takes them instead of building them again.

Why: a warm process that finds every kernel in the kernel cache still builds a plan for each op
key it meets (eager/dispatch.py, eager/planning.py): view and in-place plans run the op on meta tensors (``add_``'s
meta call alone costs about 100 us), kernel plans work out their signature and the dtypes of
their runtime scalars. The benchmark's five SGD steps build 69 plans: 3-4 ms that a process which
has run them does not pay, the larger part of what a warm start cost over a warm run.

How: as a process exits, the plans it holds are written per device to
``<cache>/plans/<tag>-<device>.plans`` (the store's entry layout: a checksum, then the bytes). The
first plan a later process needs on that device reads the file once; each key found there then
becomes its plan without a meta call (a kernel plan still takes its kernel from the kernel cache,
and is built the usual way if the kernel is gone). This is sound for the reason the in-memory
plan cache is: a plan depends only on its key (op, shapes, dtypes, strides, constants), so a key
that was planned once is planned the same way again. Keys name devices, not torch indices, which
depend on the order a process opened its devices in.

The tag holds everything a plan depends on besides its key: turbine's version and PLAN_VERSION,
torch's version (its meta kernels), the lowering version and the device's compile target (a
kernel plan keeps its kernel's signature and the digest that names the kernel's entry). A file holds each
op's plans pickled apart (MAX_OPS, MAX_PER_OP), read by an unpickler that admits only numbers,
strings, tuples and torch dtypes. ``TURBINE_CACHE_PLANS=0`` turns this off.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import logging
import pickle
from typing import Any, Callable

import torch

import turbine
from turbine.config import config
from turbine.device import Device, by_index
from turbine.eager import runtime
from turbine.kernels_cache import LOWERING_VERSION, DiskStore, kernel_cache, target_for

log = logging.getLogger("turbine")

#: Bump by hand when a plan's record changes meaning (the plans' ``record`` methods: eager/plans.py,
#: eager/kernel_plan.py), or planning gives a key another kind of plan (3: pointwise calls on
#: inputs in another memory order, eager/ordered_plan.py; 5: kernel plans keep the memory orders their
#: kernels read and write, eager/kernel_orders.py, and results are copied into torch's order,
#: eager/relaid_plan.py).
PLAN_VERSION = 5

#: A file keeps the plans of the MAX_OPS ops written last, at most MAX_PER_OP plans each (the
#: newest). Each op's plans are decoded at the first plan of that op a process needs, so a file
#: filled by other workloads costs a process little more than the plans it takes.
MAX_OPS = 512
MAX_PER_OP = 256

#: Each op's name in the files, worked out once per op. (What was read from the files, per device,
#: and whether this process built a plan no file gave it, are kept in eager/runtime.py.)
_names: dict[Any, str] = {}


def take(key: tuple, device: Device) -> tuple | None:
    """The saved record of a plan key (op first, the device index last), or None."""
    state = runtime.state.device(device.index)
    tables = state.saved_plans
    if tables is None:
        tables = state.saved_plans = _read(device)
    if not tables:
        return None
    op = key[0]
    name = _names.get(op) or _names.setdefault(op, _op_name(op))
    table = tables.get(name)
    if table is None:
        return None
    if not isinstance(table, dict):
        table = tables[name] = _decoded(table, device)
    return table.pop(key[1:-1], None)


def built() -> None:
    """Note that a plan was built here (eager/dispatch.py), so that the exit writes this process's plans."""
    runtime.state.built_plans = True


def forget() -> None:
    """Drop what was read, so that the next plan reads the files again (dispatch.clear_plans)."""
    state = runtime.state
    for index in state.device_indices():
        state.device(index).saved_plans = None


def _store() -> DiskStore | None:
    store = kernel_cache.store
    return store if config.cache_plans and isinstance(store, DiskStore) else None


def _file_name(device: Device) -> str:
    """Per device and its compile target: kernel plans keep their kernel's digest, which the
    target is part of (another target, through TURBINE_CPU_TARGET say, reads another file)."""
    versions = f"{turbine.__version__} {PLAN_VERSION} {torch.__version__} {LOWERING_VERSION} {target_for(device).key()}"
    tag = hashlib.sha256(versions.encode()).hexdigest()[:16]
    return f"{tag}-{device.name.replace(':', '-')}"


def _read(device: Device) -> dict[str, bytes]:
    """A device's file: each op's pickled plans by op name; empty if there is none."""
    store = _store()
    data = store.load_plans(_file_name(device)) if store is not None else None
    return {} if data is None else _decoded(data, device)


def _decoded(data: bytes | memoryview, device: Device) -> dict:
    try:
        return _decode(data)
    except Exception as error:  # it passed its checksum: written by another turbine, or by hand
        log.warning("turbine: ignoring saved plans of %s that cannot be read (%s)", device.name, error)
        return {}


def _op_name(op: Any) -> str:
    return f"{op.namespace}::{op._opname}.{op._overloadname}"


# --- writing at exit ------------------------------------------------------------------------


def save(plans: dict[tuple, Any]) -> None:
    """Write the plans this process holds as each device's newest (registered with atexit by
    dispatch.py). Plans whose ``record()`` is None (fallbacks, kernels still compiling) and
    keys holding values the unpickler would refuse are left out."""
    store = _store()
    if store is None or not store.writable or not runtime.state.built_plans:
        return
    by_device: dict[int, dict[str, dict[tuple, tuple]]] = {}
    for key, plan in list(plans.items()):
        record = plan.record()
        if record is None or not _storable(key[1:-1]) or not _storable(record):
            continue
        by_device.setdefault(key[-1], {}).setdefault(_op_name(key[0]), {})[key[1:-1]] = record
    for index, by_op in by_device.items():
        store.update_plans(_file_name(by_index(index)), _merged(by_op))


def _merged(by_op: dict[str, dict[tuple, tuple]]) -> Callable[[memoryview | None], bytes]:
    """How a file's bytes become bytes that hold ``by_op``'s plans as the newest."""

    def update(data: memoryview | None) -> bytes:
        try:
            tables = _decode(data) if data is not None else {}
            for name, records in by_op.items():
                older = _decode(tables.pop(name)) if name in tables else {}
                kept = {key: record for key, record in older.items() if key not in records}
                kept.update(records)
                tables[name] = _encode(dict(list(kept.items())[-MAX_PER_OP:]))
        except Exception:  # an unreadable file is replaced by this process's plans
            tables = {name: _encode(records) for name, records in by_op.items()}
        return _encode(dict(list(tables.items())[-MAX_OPS:]))

    return update


def _encode(value: dict) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


_STORABLE_TYPES = (str, int, float, bool, complex, type(None), torch.dtype)
_NUMBER_TYPES = (int, float, bool, complex)


def _storable(value: Any) -> bool:
    """Whether a key or record holds only what the unpickler admits."""
    if isinstance(value, (tuple, list)):
        return all(_storable(item) for item in value)
    return isinstance(value, _STORABLE_TYPES) or (isinstance(value, type) and value in _NUMBER_TYPES)


# --- reading --------------------------------------------------------------------------------


class _Unpickler(pickle.Unpickler):
    """Admits the number types and torch dtypes, nothing else: a cache file must not be able to
    name any other global (a pickle that can runs code)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in ("int", "float", "bool", "complex"):
            return getattr(builtins, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"a plan file may not name {module}.{name}")


def _decode(data: bytes | memoryview) -> dict:
    saved = _Unpickler(io.BytesIO(data)).load()
    if not isinstance(saved, dict):
        raise pickle.UnpicklingError("saved plans are a dict")
    return saved
