"""The on-disk kernel cache: reuse across processes, safety, size limit, negative entries, CLI."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import turbine
from conftest import forget_memory
from turbine.eager import dispatch, planning
from turbine.kernels_cache import CacheWarning, DiskStore, kernel_cache
from turbine.kernels_cache import cache as cache_module

WORKLOAD = textwrap.dedent(
    """
    import json, torch, turbine
    torch.manual_seed(0)
    x = torch.randn(16, 24, device="turbine:cpu")
    w = torch.randn(24, 8, device="turbine:cpu")
    y = torch.softmax(torch.tanh(x @ w) * 0.5, dim=1)
    assert torch.allclose(y.cpu(), torch.softmax(torch.tanh(x.cpu() @ w.cpu()) * 0.5, dim=1), atol=1e-5)
    print(json.dumps(turbine.stats()))
    """
)


def run_workload(cache_dir, script=WORKLOAD, **env):
    environment = dict(os.environ, TURBINE_CACHE_DIR=str(cache_dir), **env)
    result = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.slow  # new processes
def test_second_process_compiles_nothing(tmp_path):
    first, _ = run_workload(tmp_path)
    second, _ = run_workload(tmp_path)
    assert first["kernels_compiled"] >= 4
    assert second["kernels_compiled"] == 0
    assert second["cache_hits_disk"] == first["kernels_compiled"]


def test_entries_hold_module_and_readable_record(fresh_cache):
    torch.exp(torch.randn(3, 5, device="turbine:cpu")).cpu()
    entries = list(fresh_cache.entries())
    assert len(entries) >= 1
    record = entries[0]["record"]
    for field in ["op", "signature", "target", "compile_seconds", "created", "compiler", "bytes", "tied"]:
        assert field in record
    assert "aten.exp" in json.dumps([e["op"] for e in entries])
    # One file: a checksum line, the record as a line of JSON, then the module.
    checksum, line, module = Path(fresh_cache.entry_path(entries[0]["digest"])).read_bytes().split(b"\n", 2)
    assert json.loads(line) == record and len(module) == record["bytes"]
    assert checksum.decode() == hashlib.sha256(line + b"\n" + module).hexdigest()


def test_lookup_goes_memory_then_disk_then_compile(fresh_cache, stats):
    x = torch.randn(4, 4, device="turbine:cpu")
    torch.cos(x).cpu()
    assert stats()["kernels_compiled"] == 1
    torch.cos(x).cpu()
    assert stats()["kernels_compiled"] == 1  # the plan holds the kernel: no lookup at all
    forget_memory()
    torch.testing.assert_close(torch.cos(x).cpu(), torch.cos(x.cpu()))
    assert stats()["kernels_compiled"] == 1
    assert stats()["cache_hits_disk"] == 1


@pytest.mark.slow  # new processes
def test_four_processes_compiling_at_once(tmp_path):
    environment = dict(os.environ, TURBINE_CACHE_DIR=str(tmp_path))
    processes = [
        subprocess.Popen([sys.executable, "-c", WORKLOAD], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
    store = DiskStore(tmp_path, 2**30)
    entries = list(store.entries())
    assert entries and len({e["digest"] for e in entries}) == len(entries)
    for entry in entries:
        assert store.load(entry["digest"]) is not None
    assert not list(tmp_path.glob("kernels/*/.tmp-*"))
    again, _ = run_workload(tmp_path)
    assert again["kernels_compiled"] == 0


def test_corrupt_entry_is_removed_and_recompiled_with_one_warning(fresh_cache, stats):
    x = torch.randn(6, device="turbine:cpu")
    torch.sin(x).cpu()
    (entry,) = [e for e in fresh_cache.entries() if "sin" in e["op"]]
    path = Path(fresh_cache.entry_path(entry["digest"]))
    path.write_bytes(path.read_bytes()[:300])
    forget_memory()
    with pytest.warns(CacheWarning, match="truncated or corrupt") as caught:
        torch.testing.assert_close(torch.sin(x).cpu(), torch.sin(x.cpu()))
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert stats()["kernels_compiled"] == 2
    assert fresh_cache.load(entry["digest"]) is not None


def test_a_damaged_record_is_caught_by_the_checksum(fresh_cache, stats):
    """The record holds the output shapes a warm process builds its plan from: a changed digit
    there must not pass as a valid entry."""
    x = torch.randn(6, device="turbine:cpu")
    torch.cos(x).cpu()
    (entry,) = [e for e in fresh_cache.entries() if "cos" in e["op"]]
    path = Path(fresh_cache.entry_path(entry["digest"]))
    data = path.read_bytes()
    assert data.count(b'"outputs": [[[6]') == 1
    path.write_bytes(data.replace(b'"outputs": [[[6]', b'"outputs": [[[7]'))
    forget_memory()
    with pytest.warns(CacheWarning, match="checksum does not match"):
        torch.testing.assert_close(torch.cos(x).cpu(), torch.cos(x.cpu()))
    assert stats()["kernels_compiled"] == 2


def test_inputs_a_kernel_hands_back_are_kept_with_its_entry(fresh_cache, monkeypatch):
    """A scatter hands its input buffer back (iree-org/iree#16168). The first call finds that by
    copying every input; the entry then keeps it, so a kernel loaded from disk copies only that
    input and the input still stays intact."""
    from turbine.kernels_cache.kernel import Kernel

    copies = []
    copy = Kernel._copy

    def counted(self, view, wait):
        if not self.metadata.get("dynamic"):  # the scatter's, not its index check's (a kernel for any length)
            copies.append(1)
        return copy(self, view, wait)

    monkeypatch.setattr(Kernel, "_copy", counted)
    x = torch.randn(5, 4)
    index, source = torch.zeros(1, 4, dtype=torch.int64), torch.ones(1, 4)
    xd = x.to("turbine:cpu")
    expected = x.scatter(0, index, source)
    torch.testing.assert_close(xd.scatter(0, index.to(xd.device), source.to(xd.device)).cpu(), expected)
    (entry,) = [e for e in fresh_cache.entries() if e["op"].startswith("aten.scatter.src")]
    assert entry["record"]["tied"] == [0]
    assert len(copies) == 3  # the first call copied all three inputs
    forget_memory()
    copies.clear()
    torch.testing.assert_close(xd.scatter(0, index.to(xd.device), source.to(xd.device)).cpu(), expected)
    assert len(copies) == 1
    torch.testing.assert_close(xd.cpu(), x)


def test_unwritable_cache_dir_degrades_to_memory_with_one_warning(tmp_path, monkeypatch, stats):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(CacheWarning, match="cannot be written"):
        store = DiskStore(blocker / "cache", 2**30)
    monkeypatch.setattr(kernel_cache, "store", store)
    forget_memory()
    x = torch.randn(5, device="turbine:cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        torch.testing.assert_close(torch.atan(x).cpu(), torch.atan(x.cpu()))
        torch.testing.assert_close(torch.erf(x).cpu(), torch.erf(x.cpu()))
    assert stats()["kernels_compiled"] == 2
    forget_memory()


def test_full_disk_degrades_to_memory_with_one_warning(fresh_cache, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("turbine.kernels_cache.store.os.replace", full)
    x = torch.randn(7, device="turbine:cpu")
    with pytest.warns(CacheWarning, match="No space left"):
        torch.testing.assert_close(torch.asinh(x).cpu(), torch.asinh(x.cpu()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(torch.acosh(x.abs() + 1).cpu(), torch.acosh(x.cpu().abs() + 1))
    assert not list(fresh_cache.root.glob("kernels/*/*"))


def test_ctrl_c_during_compile_or_write_leaves_no_entry(fresh_cache, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    x = torch.randn(3, device="turbine:cpu")
    positive = x.abs()
    positive.cpu()  # its kernel written first: no compile of it in the background races the check below
    monkeypatch.setattr(cache_module, "compile_mlir", interrupted)
    with pytest.raises(KeyboardInterrupt):
        torch.expm1(x).cpu()
    monkeypatch.undo()
    monkeypatch.setattr(kernel_cache, "store", fresh_cache)
    written = set(fresh_cache.root.glob("kernels/*/*"))  # abs's kernel
    monkeypatch.setattr("turbine.kernels_cache.store.os.replace", interrupted)
    forget_memory()
    with pytest.raises(KeyboardInterrupt):
        torch.log1p(positive).cpu()
    assert set(fresh_cache.root.glob("kernels/*/*")) == written  # no entry, no temporary file
    monkeypatch.undo()
    monkeypatch.setattr(kernel_cache, "store", fresh_cache)
    forget_memory()
    torch.testing.assert_close(torch.expm1(x).cpu(), torch.expm1(x.cpu()))


def test_size_limit_evicts_least_recently_used(tmp_path):
    store = DiskStore(tmp_path, max_bytes=2**30)
    for i, digest in enumerate(["a" * 64, "b" * 64, "c" * 64]):
        store.save(digest, bytes([i]) * 1000, {"op": f"op{i}"})
        os.utime(store.entry_path(digest), (1000 + i, 1000 + i))
    store.max_bytes = 7 * os.path.getsize(store.entry_path("a" * 64)) // 2  # room for three entries of this size
    store.load("a" * 64)  # touching "a" makes "b" the least recently used
    store.save("d" * 64, b"d" * 1000, {"op": "op3"})
    assert {e["digest"][0] for e in store.entries()} == {"a", "c", "d"}
    assert sum(e["bytes"] for e in store.entries()) <= store.max_bytes


def test_files_of_the_old_layout_count_toward_the_limit_and_go_first(tmp_path):
    """An older turbine kept each entry as a .vmfb and a .json: those files are no entries now,
    but they use the disk, so the size limit counts and evicts them."""
    shard = tmp_path / "kernels" / "ab"
    shard.mkdir(parents=True)
    for suffix in (".vmfb", ".json"):
        old = shard / f"{'ab' * 32}{suffix}"
        old.write_bytes(b"x" * 1500)
        os.utime(old, (1000, 1000))
    store = DiskStore(tmp_path, max_bytes=2000)
    assert not list(store.entries())
    store.save("c" * 64, b"c" * 1000, {"op": "new"})
    assert not list(shard.iterdir())  # about 4100 bytes were past the limit: the old files went
    assert [e["op"] for e in store.entries()] == ["new"]


def test_saves_list_the_directory_only_when_the_limit_may_be_passed(tmp_path, monkeypatch):
    """A cache of many entries must not be listed at every save (a cold run saves each kernel,
    then rewrites it once its tied inputs are known)."""
    store = DiskStore(tmp_path, max_bytes=6000)
    listings = []
    entry_files = store._entry_files
    monkeypatch.setattr(store, "_entry_files", lambda: listings.append(1) or entry_files())
    for i in range(4):
        store.save(f"{i}" * 64, bytes([i]) * 1000, {"op": f"op{i}"})
    assert len(listings) == 1  # the first save learns the size; the next ones add to it
    for i in range(4, 8):
        store.save(f"{i}" * 64, bytes([i]) * 1000, {"op": f"op{i}"})
    assert len(listings) > 1  # past the limit: listed again, and evicted
    assert sum(e["bytes"] for e in store.entries()) <= 6000


@pytest.mark.slow  # new processes
def test_failed_compile_is_remembered_across_processes(tmp_path):
    script = textwrap.dedent(
        """
        import json, torch, turbine
        torch.exp(torch.rand(4, device="turbine:cpu")).cpu()
        try:
            torch.special.airy_ai(torch.rand(4, device="turbine:cpu")).cpu()
        except turbine.CompileError as error:
            print("failed:", str(error).splitlines()[0])
        print(json.dumps(turbine.stats()))
        """
    )
    first, _ = run_workload(tmp_path, script)
    second, _ = run_workload(tmp_path, script)
    assert first["compile_failures"] >= 1
    assert second["compile_failures"] == 0 and second["kernels_compiled"] == 0
    store = DiskStore(tmp_path, 2**30)
    assert store.failures()
    assert store.clear(failed_only=True) >= 1
    assert not store.failures() and list(store.entries())


def test_turbine_cache_0_turns_the_disk_off(tmp_path):
    first, _ = run_workload(tmp_path, TURBINE_CACHE="0")
    assert first["kernels_compiled"] >= 4
    assert not any(tmp_path.iterdir())  # nothing written to the cache directory


@pytest.mark.slow  # new processes
def test_cli_info_list_clear(tmp_path):
    run_workload(tmp_path)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "turbine", *args], capture_output=True, text=True, timeout=120)

    info = cli("cache", "info", "--dir", str(tmp_path))
    assert info.returncode == 0 and "kernels" in info.stdout and str(tmp_path) in info.stdout
    listing = cli("cache", "list", "--dir", str(tmp_path), "--op", "aten.mm")
    assert "aten.mm" in listing.stdout and "aten.tanh" not in listing.stdout
    refused = cli("cache", "clear", "--dir", str(tmp_path), "--op", "aten.mm")  # --op is list's alone
    assert refused.returncode == 2 and "--op filters" in refused.stderr
    assert list(DiskStore(tmp_path, 2**30).entries())
    cleared = cli("cache", "clear", "--dir", str(tmp_path))
    assert cleared.returncode == 0 and "removed" in cleared.stdout
    assert not list(DiskStore(tmp_path, 2**30).entries())
    missing = cli("cache", "info", "--dir", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no turbine kernel cache" in missing.stderr
    general = cli("info")
    assert "kernel cache" in general.stdout and "torch" in general.stdout


def test_cli_stops_quietly_when_its_reader_goes_away(tmp_path):
    """``cache list | head`` closes the pipe before the listing is written: no traceback."""
    run_workload(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "turbine", "cache", "list", "--dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # before the listing starts: its first write finds no reader
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141 and "Traceback" not in stderr, stderr


def test_compiles_are_logged_when_not_interactive_and_quiet_from_cache(fresh_cache, caplog):
    x = torch.randn(9, device="turbine:cpu")
    with caplog.at_level("INFO", logger="turbine"):
        torch.sinh(x).cpu()
    assert any("compiling aten.sinh" in r.getMessage() for r in caplog.records)
    caplog.clear()
    forget_memory()
    with caplog.at_level("INFO", logger="turbine"):
        torch.sinh(x).cpu()
    assert not any("compiling" in r.getMessage() for r in caplog.records)
    forget_memory()
    with turbine.override(progress=False), caplog.at_level("INFO", logger="turbine"):
        torch.cosh(x).cpu()
    assert not any("compiling" in r.getMessage() for r in caplog.records)


def test_compile_burst_shows_a_progress_bar_that_goes_away(fresh_cache, monkeypatch):
    from turbine.kernels_cache import progress as progress_module

    monkeypatch.setattr(progress_module, "_interactive", lambda: True)
    monkeypatch.setattr(progress_module, "BURST_GAP", 30.0)
    bar = progress_module.progress
    bar.close()
    bar.last = 0.0  # start a new burst whatever earlier tests compiled
    x = torch.randn(11, device="turbine:cpu")
    torch.sin(x).cpu()
    assert bar.bar is None  # one compile is not worth a bar
    torch.cos(x).cpu()
    assert bar.bar is not None and bar.bar.n == 2
    monkeypatch.setattr(cache_module, "BURST_GAP", 0.0)  # the burst is over
    dispatch.clear_plans()
    torch.sin(x)  # a memory-cache hit once compiling stopped closes the bar
    assert bar.bar is None


def test_bad_cache_size_setting_names_the_variable(monkeypatch):
    from turbine.config import Config

    monkeypatch.setenv("TURBINE_CACHE_MAX_BYTES", "2GB")
    with pytest.raises(ValueError, match="TURBINE_CACHE_MAX_BYTES must be a whole number"):
        Config.from_env()


def test_a_warm_process_builds_plans_from_stored_layouts(fresh_cache, monkeypatch, stats):
    """A kernel found in the store carries its output layouts, so the plan needs no meta check:
    with the meta call made to fail, multi-output ops still match torch."""
    x = torch.randn(4, 6)
    cases = [lambda t: torch.max(t, 1), lambda t: torch.var_mean(t, 0), lambda t: t * 2 + 1]
    for case in cases:
        result = case(x.to("turbine:cpu"))
        for tensor in [result] if isinstance(result, torch.Tensor) else result:
            tensor.cpu()
    forget_memory()

    def no_meta(*args, **kwargs):
        raise AssertionError("the meta call ran although the store had the kernel")

    monkeypatch.setattr(planning, "meta_call", no_meta)
    compiled = stats()["kernels_compiled"]
    for case in cases:
        expected, actual = case(x), case(x.to("turbine:cpu"))
        if isinstance(expected, torch.Tensor):
            expected, actual = (expected,), (actual,)
        assert type(actual) is type(expected)
        for e, a in zip(expected, actual):
            torch.testing.assert_close(a.cpu(), e)
    assert stats()["kernels_compiled"] == compiled and stats()["cache_hits_disk"] > 0
