"""Shared fixtures. Tests compare turbine with torch on the CPU, on random data."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings

# A fresh kernel cache per test session: tests count compiles and must not depend on (or fill)
# the user's cache. Set before turbine is imported, since the cache reads it at import.
os.environ.setdefault("TURBINE_CACHE_DIR", tempfile.mkdtemp(prefix="turbine-test-cache-"))
# No bundle builder after the test session: it would compile every kernel the tests used (the
# tests of bundles turn them on for themselves).
os.environ.setdefault("TURBINE_CACHE_BUNDLES", "0")
# No saved plans either: tests count meta calls and plans (test_saved_plans.py turns them on).
os.environ.setdefault("TURBINE_CACHE_PLANS", "0")
# IREE's kernels alone: tests of ops test IREE's lowerings, which a vendor kernel chosen by timing
# would hide on a GPU (test_vendor.py turns the vendor executor on).
os.environ.setdefault("TURBINE_EXECUTORS", "iree")

import pytest  # noqa: E402
import torch  # noqa: E402

import turbine  # noqa: E402
from turbine.eager import deferred, dispatch  # noqa: E402
from turbine.kernels_cache import DiskStore, kernel_cache  # noqa: E402

from checks import D as DEVICE  # noqa: E402

_recording = os.environ.get("TURBINE_RECORD_WRITES")
if _recording:  # record the calls tests/test_written_arguments.py replays (tests/written_calls.py)
    from written_calls import Recorder

    _recorder = Recorder()
    dispatch.run = _recorder.wrap(dispatch.run)


def pytest_sessionfinish(session, exitstatus):
    if _recording:
        _recorder.save(_recording)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def stats():
    """Counters zeroed at the start of the test; call it to read them."""
    turbine.reset_stats()
    return turbine.stats


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


@pytest.fixture(autouse=True)
def _no_launch_outlives_its_test():
    """Ops whose kernels compile in the background launch when read; a test that never reads
    them must not leave their compiles counting in the next test's stats. Ops that ran on the
    vendor while IREE's kernel compiled leave that compile running: it is waited for too."""
    yield
    with contextlib.suppress(Exception):
        deferred.flush_all()
    kernel_cache.wait_for_compiles(timeout=600)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """This process's kernel cache on an empty directory, with plans and memory cleared."""
    store = DiskStore(tmp_path / "cache", 2**30)
    monkeypatch.setattr(kernel_cache, "store", store)
    forget_memory()
    yield store
    forget_memory()


def damage(path, offset: int) -> None:
    """Flip the bits of one byte of a cache file, as a disk fault might."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def cache_warnings(run) -> list[str]:
    """The CacheWarning messages ``run()`` gives."""
    from turbine.kernels_cache import CacheWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def forget_memory() -> None:
    """Forget kernels and plans, as a new process would start (the disk store stays)."""
    kernel_cache.clear_memory()
    dispatch.clear_plans()
