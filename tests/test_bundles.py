"""Kernel bundles: the kernels a process used, compiled into one module that the next process loads at once."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import filelock
import pytest
import torch

import turbine
from conftest import cache_warnings, damage, forget_memory
from turbine.config import override
from turbine.eager import lowering
from turbine.kernels_cache import bundles
from turbine.kernels_cache import cache as cache_module


@pytest.fixture(autouse=True)
def _bundles_on():
    """conftest turns bundles off for the test session's own exit; these tests use them."""
    with override(cache_bundles=True):
        yield


def ops(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> list[torch.Tensor]:
    """A few kernels, a scatter among them (it hands its input buffer back: iree-org/iree#16168)."""
    return [torch.tanh(x) * 3 + 1, x.sum(0), x.scatter(0, index, source)]


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(5, 4), torch.randint(0, 5, (2, 4)), torch.randn(2, 4)


def run_ops(host: tuple) -> None:
    """The ops on turbine:cpu, checked against torch on the CPU; the inputs must stay intact."""
    device = tuple(t.to("turbine:cpu") for t in host)
    for actual, expected in zip(ops(*device), ops(*host)):
        torch.testing.assert_close(actual.cpu(), expected)
    for tensor, original in zip(device, host):
        torch.testing.assert_close(tensor.cpu(), original)


def used_digests() -> list[str]:
    return [cache_module.digest_of(key) for key in cache_module.kernel_cache._unbundled]


def test_merged_sources_keep_each_kernel_under_its_own_name():
    texts = {
        "k0": lowering.lower(lambda a: [torch.tanh(a)], [((3,), torch.float32)]),
        "k1": lowering.lower(lambda a, b: [a * b], [((2, 2), torch.float32), ((2, 2), torch.float32)]),
    }
    assert all(bundles.bundleable(text, "llvm-cpu") for text in texts.values())
    assert not bundles.bundleable(texts["k0"], "cuda")  # the driver would compile the whole bundle's PTX again
    merged = bundles.merge(texts)
    assert merged.count("func.func ") == 2 and "@k0(" in merged and "@k1(" in merged and "@main" not in merged
    assert merged.startswith("module {") and merged.count("module") == 1
    assert not bundles.bundleable(texts["k0"].replace("}\n}", "}\n  func.func @other() {\n  }\n}"), "llvm-cpu")
    assert not bundles.bundleable(texts["k0"] + '{-#\n  dialect_resources: {}\n#-}\n', "llvm-cpu")


def test_a_bundle_serves_every_member_from_one_read(fresh_cache, stats):
    host = inputs()
    run_ops(host)
    digests = used_digests()
    assert len(digests) >= 4
    bundle = bundles.build(fresh_cache, digests)
    assert bundle is not None and os.path.exists(fresh_cache.bundle_path(bundle))
    for digest in digests:
        assert fresh_cache.load(digest)[1]["bundle"] == bundle  # members name their bundle

    forget_memory()
    reads = []
    load = fresh_cache.load
    fresh_cache.load = lambda digest: reads.append(digest) or load(digest)
    turbine.reset_stats()
    run_ops(host)  # the scatter's input intact: its member kept which input it hands back
    counts = stats()
    assert counts["kernels_compiled"] == 0 and counts["bundles_loaded"] == 1
    assert counts["cache_hits_disk"] == len(digests)
    assert len(reads) == 1  # one entry read; the bundle gave the others
    assert cache_module.kernel_cache._unbundled == {}  # nothing left to bundle


def test_a_damaged_bundle_warns_once_and_members_load_alone(fresh_cache, stats):
    host = inputs()
    run_ops(host)
    bundle = bundles.build(fresh_cache, used_digests())
    path = Path(fresh_cache.bundle_path(bundle))
    damage(path, -100)
    forget_memory()
    turbine.reset_stats()
    assert cache_warnings(lambda: run_ops(host)) == [
        f"turbine's kernel cache bundle {bundle[:12]} was truncated or corrupt (checksum does not match); it is removed and its kernels load from their own entries."
    ]
    counts = stats()
    assert counts["kernels_compiled"] == 0 and counts["bundles_loaded"] == 0 and not path.exists()


def test_a_bundle_that_fails_to_compile_is_not_tried_again(fresh_cache, monkeypatch):
    run_ops(inputs())
    digests = used_digests()
    calls = []

    def failing(text, target):
        calls.append(text)
        raise bundles.CompileError("error: a merged module the compiler rejects")

    monkeypatch.setattr(bundles, "compile_mlir", failing)
    assert bundles.build(fresh_cache, digests) is None
    assert bundles.build(fresh_cache, digests) is None
    assert len(calls) == 1
    assert all("bundle" not in fresh_cache.load(d)[1] for d in digests)


def test_members_need_a_source_and_one_target(fresh_cache):
    run_ops(inputs())
    first, second, *others = used_digests()
    os.unlink(fresh_cache.source_path(first))  # an entry from before sources were kept
    with override(cpu_target="generic"):  # a kernel of another target
        torch.exp(torch.randn(3, device="turbine:cpu")).cpu()
    other_target = used_digests()[-1]
    bundle = bundles.build(fresh_cache, [first, second, *others, other_target])
    (_, record) = fresh_cache.load_bundle(bundle)
    assert set(record["members"]) == {second, *others}


BUNDLE_WORKLOAD = textwrap.dedent(
    """
    import json, torch, turbine
    torch.manual_seed(0)
    x = torch.randn(6, 5, device="turbine:cpu")
    y = (torch.relu(x) * 2 - 1).sum(0) / 3
    torch.testing.assert_close(y.cpu(), (torch.relu(x.cpu()) * 2 - 1).sum(0) / 3)
    print(json.dumps(turbine.stats()))
    """
)


def run_process(cache_dir, **env):
    environment = dict(os.environ, TURBINE_CACHE_DIR=str(cache_dir), TURBINE_BUNDLE_MIN_KERNELS="3", **env)
    result = subprocess.run([sys.executable, "-c", BUNDLE_WORKLOAD], env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # new processes
def test_a_process_that_exits_leaves_a_bundle_for_the_next(tmp_path):
    """Off, no builder starts; on, the process's exit starts one and the next process loads its bundle."""
    first = run_process(tmp_path, TURBINE_CACHE_BUNDLES="0")
    assert first["kernels_compiled"] >= 3
    assert bundles.wait_for_builders(tmp_path, timeout=300)
    assert not list(tmp_path.glob("kernels/*/*.bundle"))

    second = run_process(tmp_path, TURBINE_CACHE_BUNDLES="1")
    assert second["kernels_compiled"] == 0 and second["bundles_loaded"] == 0
    assert bundles.wait_for_builders(tmp_path, timeout=300)
    assert len(list(tmp_path.glob("kernels/*/*.bundle"))) == 1
    assert not (tmp_path / "building" / "error.log").exists()
    assert not list((tmp_path / "building").iterdir())  # the job is done and gone

    third = run_process(tmp_path, TURBINE_CACHE_BUNDLES="1")
    assert third["kernels_compiled"] == 0 and third["bundles_loaded"] == 1
    assert third["cache_hits_disk"] == first["kernels_compiled"]


@pytest.mark.parametrize("stale", [False, True])
def test_waiting_for_builders_ignores_jobs_of_killed_builders(tmp_path, stale):
    jobs = tmp_path / "building"
    jobs.mkdir()
    job = jobs / "job.json"
    job.write_text("[]")
    if stale:
        os.utime(job, (0, 0))
    assert bundles.wait_for_builders(tmp_path, timeout=0.2) is stale


def test_a_bundle_runs_from_a_mapping_of_its_file(fresh_cache):
    """A bundle's module starts 64 bytes aligned in its file, so IREE runs it from the file's
    mapping without copying it; a module that is not aligned is copied."""
    import mmap

    from turbine.device import registry
    from turbine.kernels_cache import kernel

    run_ops(inputs())
    bundle = bundles.build(fresh_cache, used_digests())
    module, _ = fresh_cache.load_bundle(bundle)
    assert isinstance(module.obj, mmap.mmap)
    assert (os.path.getsize(fresh_cache.bundle_path(bundle)) - len(module)) % 64 == 0
    device = registry.open_device("turbine:cpu")
    assert kernel._mapped(device, module) is not None
    assert kernel._mapped(device, module[1:]) is None
    assert kernel._mapped(device, bytes(module)) is None


def test_cache_info_counts_bundles_and_sources_and_clear_removes_them(fresh_cache):
    run_ops(inputs())
    bundles.build(fresh_cache, used_digests())
    files = [path for path in (fresh_cache.root / "kernels").glob("*/*")]
    assert {path.suffix for path in files} == {".kernel", ".mlir", ".bundle"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "turbine", "cache", *args, "--dir", str(fresh_cache.root)], capture_output=True, text=True, timeout=120)

    info = cli("info").stdout
    assert "1 bundles" in info and f"{sum(path.stat().st_size for path in files)} (limit" in info
    assert cli("clear").returncode == 0
    assert not list((fresh_cache.root / "kernels").glob("*/*"))


def test_an_exiting_process_starts_a_builder_only_when_it_should(fresh_cache, monkeypatch):
    """At exit: enough unbundled kernels, bundles on, and a writable store on disk; else nothing."""
    started = []
    monkeypatch.setattr(bundles, "start_builder", lambda store, digests: started.append(list(digests)))
    run_ops(inputs())
    used = used_digests()
    cache = cache_module.kernel_cache
    with override(bundle_min_kernels=len(used) + 1):
        cache.bundle_at_exit()
    assert started == []
    with override(bundle_min_kernels=len(used), cache_bundles=False):
        cache.bundle_at_exit()
    assert started == []
    fresh_cache.writable = False
    with override(bundle_min_kernels=len(used)):
        cache.bundle_at_exit()
    assert started == []
    fresh_cache.writable = True
    with override(bundle_min_kernels=len(used)):
        cache.bundle_at_exit()
    assert started == [used]  # in order of first use


def test_one_builder_per_cache_directory_takes_the_queued_jobs(tmp_path, monkeypatch, capsys):
    """A process that exits while a builder is at work queues its job instead of starting another
    builder (three were seen compiling at once on a 2-core machine); ``cache info`` shows them."""
    from turbine.__main__ import main
    from turbine.kernels_cache.store import DiskStore

    store = DiskStore(tmp_path, 2**30)
    started = []
    monkeypatch.setattr(bundles.subprocess, "Popen", lambda *args, **kwargs: started.append(args))
    held = filelock.FileLock(str(tmp_path / ".bundle.lock"))
    with held:  # a builder at work
        bundles.start_builder(store, ["a", "b"])
        bundles.start_builder(store, ["c", "d", "e"])
        assert not started
        assert [job["kernels"] for job in bundles.building(tmp_path)] == [2, 3]
        assert main(["cache", "info", "--dir", str(tmp_path)]) == 0
        assert "building   0 bundles now, 2 queued: 2 kernels" in capsys.readouterr().out
        bundles._run_builder(tmp_path)  # a second builder leaves at once: the lock is taken
        assert len(bundles.building(tmp_path)) == 2
    built = []
    monkeypatch.setattr(bundles, "build", lambda store, digests: built.append(digests))
    bundles._run_builder(tmp_path)  # the builder takes every queued job, oldest first
    assert built == [["a", "b"], ["c", "d", "e"]]
    assert bundles.building(tmp_path) == []
    bundles.start_builder(store, ["f", "g"])
    assert len(started) == 1  # no builder at work: one starts


def test_a_job_queued_while_the_builder_lets_go_of_its_lock_is_built(tmp_path, monkeypatch):
    """A process that exits just as the builder finds no job left sees the lock still held and
    starts no builder: the builder looks again after letting the lock go."""
    from turbine.kernels_cache.store import DiskStore

    store = DiskStore(tmp_path, 2**30)
    monkeypatch.setattr(bundles.subprocess, "Popen", lambda *args, **kwargs: None)
    built = []
    monkeypatch.setattr(bundles, "build", lambda store, digests: built.append(digests))
    bundles.start_builder(store, ["first", "job"])
    queued_late = []

    class LateQueueLock(filelock.FileLock):
        def release(self, *args, **kwargs):
            if not queued_late and self.is_locked:  # the builder, done, lets go of its lock, and
                queued_late.append(True)  # meanwhile another process queues a job
                bundles.start_builder(store, ["late", "job"])
            return super().release(*args, **kwargs)

    monkeypatch.setattr(bundles.filelock, "FileLock", LateQueueLock)
    bundles._run_builder(tmp_path)
    assert queued_late
    assert built == [["first", "job"], ["late", "job"]]
    assert bundles.building(tmp_path) == []


def test_a_builder_holds_back_while_a_process_compiles_in_the_foreground(tmp_path, monkeypatch):
    from turbine.kernels_cache.store import DiskStore

    store = DiskStore(tmp_path, 2**30)
    monkeypatch.setattr(bundles, "_FOREGROUND_SECONDS", 5.0)
    bundles.compiling_in_foreground(store)
    waiting = threading.Thread(target=bundles._wait_for_foreground, args=(store,))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()  # the note is fresh: the builder waits
    stale = time.time() - 60
    for note in (tmp_path / "foreground").iterdir():
        os.utime(note, (stale, stale))  # the foreground process stopped compiling a while ago
    waiting.join(30)
    assert not waiting.is_alive()  # the note went stale: it goes on
