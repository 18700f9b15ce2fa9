"""Saved plans: the plans a process built, kept on disk so that the next process takes them."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import turbine
from conftest import cache_warnings, damage, forget_memory
from turbine.config import override
from turbine.eager import dispatch, planning, runtime, saved_plans
from turbine.kernels_cache import cache as cache_module


@pytest.fixture(autouse=True)
def _plans_on(monkeypatch):
    """conftest turns saved plans off for the test session; these tests use them."""
    monkeypatch.setattr(runtime.state, "built_plans", True)
    with override(cache_plans=True):
        yield


def workload(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """Every kind of plan: kernels (one with two results), views (a partial one among them),
    in-place ops on a whole tensor and on a partial view, an op whose result is empty."""
    y = x @ w.t() + 1.5
    values, indices = torch.max(y, dim=1)
    z = y.clone()
    z.mul_(0.5)
    z[1:3].add_(x[1:3, :2].sum(1, keepdim=True))
    empty = x[:0] * 2
    return [y, values, indices, z, z.view(-1).narrow(0, 2, 5), empty]


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 3), torch.randn(2, 3)


def check(host: tuple) -> None:
    device = [t.to("turbine:cpu") for t in host]
    for actual, expected in zip(workload(*device), workload(*host)):
        torch.testing.assert_close(actual.cpu(), expected)


def no_meta_calls(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a saved plan was built again")

    monkeypatch.setattr(planning, "meta_call", refuse)


def test_saved_plans_replace_building_them(fresh_cache, stats, monkeypatch):
    host = inputs()
    check(host)
    planned = len(dispatch.plans())
    saved_plans.save(dispatch.plans())
    forget_memory()
    no_meta_calls(monkeypatch)
    hashed = []
    digest_of = cache_module.digest_of
    monkeypatch.setattr(cache_module, "digest_of", lambda key: hashed.append(key) or digest_of(key))
    turbine.reset_stats()
    check(host)
    counts = stats()
    assert counts["kernels_compiled"] == 0
    assert counts["plans_from_disk"] == planned == len(dispatch.plans())
    # kernel plans kept their kernel's digest (views.py's gathers and scatters are no plans'
    # kernels; once per process, each kind of them reads whether it went shape-generic)
    assert [key[0][0] for key in hashed if not key[0][0].startswith(("turbine.", "generic family"))] == []


def test_a_result_copied_into_torchs_layout_is_planned_so_from_disk(fresh_cache, stats, monkeypatch):
    """A pooled channels-last image is channels-last (eager/relaid_plan.py) in a process that
    takes the plan from disk too."""
    x = torch.randn(2, 3, 6, 5).contiguous(memory_format=torch.channels_last)
    expected = torch.nn.functional.avg_pool2d(x, 2)
    torch.nn.functional.avg_pool2d(x.to("turbine:cpu"), 2).cpu()
    saved_plans.save(dispatch.plans())
    forget_memory()
    no_meta_calls(monkeypatch)
    turbine.reset_stats()
    actual = torch.nn.functional.avg_pool2d(x.to("turbine:cpu"), 2)
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)
    assert stats()["plans_from_disk"] >= 2 and stats()["kernels_compiled"] == 0  # the pool's and its copy's


def test_a_plan_made_with_an_older_lowering_of_its_op_is_built_again(fresh_cache, stats, monkeypatch):
    """A saved kernel plan names its kernel by a signature that ends with the digest of turbine's
    lowering of the op then: once the lowering changed (a new correction), the record named the
    old kernel, and the op ran the old lowering (upsample_nearest2d_backward's wrong gradient)."""
    from turbine.eager import registry

    host = inputs()
    check(host)
    saved_plans.save(dispatch.plans())
    forget_memory()
    digest = registry.lowering_digest
    changed = torch.ops.aten.max.dim  # the workload's op with a correction of turbine's
    monkeypatch.setattr(registry, "lowering_digest", lambda op: "changed" if op is changed else digest(op))
    turbine.reset_stats()
    check(host)
    counts = stats()
    assert counts["kernels_compiled"] == 1  # max.dim's, under its new lowering; every other plan came from the file
    assert counts["plans_from_disk"] == len(dispatch.plans()) - 1


def test_another_target_reads_another_plan_file(fresh_cache, stats):
    host = inputs()
    check(host)
    saved_plans.save(dispatch.plans())
    forget_memory()
    turbine.reset_stats()
    with override(cpu_target="generic"):
        check(host)
    counts = stats()
    assert counts["plans_from_disk"] == 0 and counts["kernels_compiled"] > 0


def test_a_plan_whose_kernel_is_gone_is_built_again(fresh_cache, stats):
    host = inputs()
    check(host)
    saved_plans.save(dispatch.plans())
    for entry in list(fresh_cache.entries()):
        fresh_cache.remove(entry["digest"])
    forget_memory()
    turbine.reset_stats()
    check(host)
    counts = stats()
    assert counts["kernels_compiled"] > 0
    assert 0 < counts["plans_from_disk"] < len(dispatch.plans())  # views and in-place plans still came from disk


def plan_file(store) -> Path:
    (path,) = (store.root / "plans").glob("*.plans")
    return path


def test_a_damaged_plan_file_warns_once_and_plans_are_built(fresh_cache, stats):
    host = inputs()
    check(host)
    saved_plans.save(dispatch.plans())
    path = plan_file(fresh_cache)
    damage(path, -10)
    forget_memory()
    turbine.reset_stats()
    messages = cache_warnings(lambda: check(host))
    assert len(messages) == 1 and "plan file" in messages[0] and "its plans are built again" in messages[0]
    assert stats()["plans_from_disk"] == 0 and not path.exists()


class _RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_plan_file_cannot_run_code(fresh_cache, stats, tmp_path):
    """A file with a valid checksum whose pickle names another global is ignored, not run."""
    marker = tmp_path / "ran"
    host = inputs()
    check(host)
    saved_plans.save(dispatch.plans())
    path = plan_file(fresh_cache)
    name = path.stem
    evil = pickle.dumps({"aten::mm.default": pickle.dumps({(): _RunsACommand(marker)})})
    fresh_cache.update_plans(name, lambda _: evil)
    forget_memory()
    turbine.reset_stats()
    check(host)
    assert not marker.exists()
    assert stats()["plans_from_disk"] == 0


def test_records_of_another_layout_are_built_again(fresh_cache, stats):
    host = inputs()
    check(host)
    saved_plans.save(dispatch.plans())
    name = plan_file(fresh_cache).stem

    def truncate(data):
        tables = saved_plans._decode(data)
        return saved_plans._encode(
            {op: saved_plans._encode({key: ("kernel",) for key in saved_plans._decode(blob)}) for op, blob in tables.items()}
        )

    fresh_cache.update_plans(name, truncate)
    forget_memory()
    turbine.reset_stats()
    check(host)
    assert stats()["plans_from_disk"] == 0


def test_each_op_keeps_its_newest_plans(fresh_cache, monkeypatch):
    monkeypatch.setattr(saved_plans, "MAX_PER_OP", 2)
    for size in (2, 3, 4):
        forget_memory()
        (torch.randn(size, device="turbine:cpu") * 2).cpu()
        saved_plans.save(dispatch.plans())
    forget_memory()
    (torch.randn(5, 5, device="turbine:cpu").sum()).cpu()  # another op, written after
    saved_plans.save(dispatch.plans())
    tables = saved_plans._decode(fresh_cache.load_plans(plan_file(fresh_cache).stem))
    assert list(tables)[-1] == "aten::sum.default"  # the op written last is the newest
    shapes = [key[0][0] for key in saved_plans._decode(tables["aten::mul.Tensor"])]
    assert shapes == [(3,), (4,)]


def test_a_cache_that_cannot_hold_plans_raises_nothing(fresh_cache, stats):
    """Plans only save time: a process that cannot write them exits as it would have."""
    host = inputs()
    check(host)
    (fresh_cache.root / "plans").write_text("a file where the plans directory should be")
    saved_plans.save(dispatch.plans())  # as at exit
    forget_memory()
    turbine.reset_stats()
    check(host)
    assert stats()["plans_from_disk"] == 0


def test_plans_holding_values_a_file_cannot_keep_are_left_out(fresh_cache):
    """A key or record with a value the unpickler would refuse (any object but numbers, strings,
    tuples and dtypes) is not written; the rest are."""
    check(inputs())
    plans = dict(dispatch.plans())
    (key, plan), *_ = [(k, p) for k, p in plans.items() if p.record() is not None]
    odd_key = (key[0], object(), *key[1:])
    plans[odd_key] = plan
    saved_plans.save(plans)
    (tables,) = [saved_plans._decode(fresh_cache.load_plans(plan_file(fresh_cache).stem))]
    written = [k for blob in tables.values() for k in saved_plans._decode(blob)]
    assert key[1:-1] in written and odd_key[1:-1] not in written


def test_switched_off_nothing_is_written_or_read(fresh_cache, stats):
    host = inputs()
    check(host)
    with override(cache_plans=False):
        saved_plans.save(dispatch.plans())
        assert not list((fresh_cache.root / "plans").glob("*.plans"))
    saved_plans.save(dispatch.plans())
    forget_memory()
    turbine.reset_stats()
    with override(cache_plans=False):
        check(host)
    assert stats()["plans_from_disk"] == 0


PROCESS = textwrap.dedent(
    """
    import json, sys, torch, turbine
    first, second = sys.argv[1:]
    turbine.device(first), turbine.device(second)  # the order decides their torch indices
    torch.manual_seed(0)
    results = {}
    for name, size in (("turbine:cpu", 4), ("turbine:cpu1", 3)):  # other shapes, other plans
        x = torch.randn(size, size)
        y = x.to(name)
        y.t().add_(1)
        torch.testing.assert_close(y.cpu(), x.t().add(1).t())
        torch.testing.assert_close((y @ y).cpu(), x.t().add(1).t() @ x.t().add(1).t())
    from turbine.eager import dispatch
    print(json.dumps(dict(turbine.stats(), plans=len(dispatch.plans()))))
    """
)


def run_process(cache_dir, *devices, **env):
    environment = dict(os.environ, TURBINE_CACHE_DIR=str(cache_dir), **{"TURBINE_CACHE_PLANS": "1", **env})
    result = subprocess.run([sys.executable, "-c", PROCESS, *devices], env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # new processes
def test_a_process_leaves_its_plans_to_the_next_by_device_name(tmp_path):
    """Plans are written as a process exits, per device name: the next process opens the two
    CPU devices in the other order (other torch indices) and takes both devices' plans."""
    first = run_process(tmp_path, "turbine:cpu1", "turbine:cpu")
    assert first["plans_from_disk"] == 0
    assert len(list((tmp_path / "plans").glob("*.plans"))) == 2
    second = run_process(tmp_path, "turbine:cpu", "turbine:cpu1")
    assert second["kernels_compiled"] == 0 and second["plans_from_disk"] == first["plans"] > 0
    off = run_process(tmp_path, "turbine:cpu", "turbine:cpu1", TURBINE_CACHE_PLANS="0")
    assert off["plans_from_disk"] == 0


def test_cache_info_counts_plan_files_and_clear_removes_them(fresh_cache):
    check(inputs())
    saved_plans.save(dispatch.plans())
    size = plan_file(fresh_cache).stat().st_size

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "turbine", "cache", *args, "--dir", str(fresh_cache.root)], capture_output=True, text=True, timeout=120)

    assert f"1 files, {size} bytes" in cli("info").stdout
    assert cli("clear", "--failed").returncode == 0 and plan_file(fresh_cache).exists()
    assert cli("clear").returncode == 0
    assert not list((fresh_cache.root / "plans").glob("*.plans"))
