"""The CI subset of the OpInfo coverage suite, and checks of the suite itself.

The full run is ``python -m turbine coverage`` (see the README); CI runs these entries, chosen to
cover each kind of op (elementwise, reductions, several outputs, lists, matmuls, nn functions,
views, indexing, a fallback op (airy_ai), a random op, decompositions), and requires every applicable case of each to pass.
Complex results are tested in tests/test_creation.py (their gradients fail: see the report).
"""

import pytest
import torch

import opinfo_runner
from checks import D
from opinfo_skips import SKIPS

CI_ENTRIES = [
    "add", "mul", "div.no_rounding_mode", "exp", "tanh", "sigmoid", "abs", "clamp", "where", "pow",
    "sum", "mean", "amax", "argmax", "max.reduction_with_dim", "topk", "cumsum", "var_mean",
    "cat", "stack", "mm", "bmm", "addmm", "matmul", "nn.functional.linear", "nn.functional.conv2d",
    "softmax", "nn.functional.relu", "nn.functional.silu", "native_layer_norm",
    "nn.functional.cross_entropy", "transpose", "permute", "reshape", "squeeze", "index_select", "gather",
    "erfinv", "nn.functional.dropout2d", "nn.functional.embedding", "special.airy_ai", "linalg.solve",
    "cummax", "median",
]

ENTRIES = opinfo_runner.entries()
DEVICE = D  # the OpInfo report itself is measured on turbine:cpu (python -m turbine coverage)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", CI_ENTRIES)
def test_entry_passes_every_case(name):
    failures = []
    for result in opinfo_runner.run_entry(ENTRIES[name], DEVICE):
        if result.status == "fail":
            failures.append(f"{result.variant} {result.dtype} {result.direction}: {result.detail}")
    assert not failures, "\n".join(failures)


def test_a_wrong_result_fails_its_case(monkeypatch):
    """The harness must notice a device result that differs from torch's."""
    op = ENTRIES["sin"]

    def off_by_one(x, *args, **kwargs):
        result = torch.sin(x, *args, **kwargs)
        return result + 1 if result.device.type == "turbine" else result

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: off_by_one)
    result = opinfo_runner.run_case(op, "function", "float32", "forward", DEVICE, 2)
    assert result.status == "fail" and "not close" in result.detail


def test_a_result_closer_to_torchs_float64_than_its_float32_passes(monkeypatch):
    """Where torch's float32 CPU kernel is the imprecise one, turbine's result is compared with
    torch's float64 result too; a result that matches neither still fails."""
    op = ENTRIES["sin"]

    def imprecise_in_float32(x, *args, **kwargs):
        result = torch.sin(x, *args, **kwargs)
        return result * (1 + 1e-3) if result.device.type == "cpu" and result.dtype == torch.float32 else result

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: imprecise_in_float32)
    result = opinfo_runner.run_case(op, "function", "float32", "forward", DEVICE, 2)
    assert result.status == "pass", result.detail

    def wrong_everywhere(x, *args, **kwargs):
        result = imprecise_in_float32(x, *args, **kwargs)
        return result + 1 if result.device.type == "turbine" else result

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: wrong_everywhere)
    result = opinfo_runner.run_case(op, "function", "float32", "forward", DEVICE, 2)
    assert result.status == "fail" and "not close" in result.detail


@pytest.mark.skipif(not (DEVICE.startswith("turbine:cuda") and torch.cuda.is_available()), reason="needs a turbine GPU device and torch CUDA")
def test_on_a_gpu_a_result_that_matches_torch_cudas_passes(monkeypatch):
    """On a GPU device a result may match torch's CUDA result instead of its CPU one (the vendor
    runs torch's CUDA kernels); a result that matches neither still fails."""
    op = ENTRIES["sin"]

    def as_on_a_gpu(x, *args, **kwargs):
        result = torch.sin(x, *args, **kwargs)
        return result * (1 + 1e-3) if result.device.type in ("turbine", "cuda") else result

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: as_on_a_gpu)
    result = opinfo_runner.run_case(op, "function", "float32", "forward", DEVICE, 2)
    assert result.status == "pass", result.detail

    def only_on_turbine(x, *args, **kwargs):
        result = torch.sin(x, *args, **kwargs)
        return result * (1 + 1e-3) if result.device.type == "turbine" else result

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: only_on_turbine)
    result = opinfo_runner.run_case(op, "function", "float32", "forward", DEVICE, 2)
    assert result.status == "fail" and "not close" in result.detail


def test_a_gradient_as_close_to_float64_as_torchs_float32_one_passes(monkeypatch):
    """Where torch's float32 CPU gradient misses the float64 one (erfcx's cancels), turbine's
    gradient passes when it is no further from the float64 gradient than torch's is; a gradient
    further off still fails."""
    op = ENTRIES["sin"]

    def imprecise_in_float32(x, *args, **kwargs):
        scale = 1 + 1e-3 if x.device.type == "cpu" and x.dtype == torch.float32 else 1.0
        return torch.sin(x * scale, *args, **kwargs)

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: imprecise_in_float32)
    result = opinfo_runner.run_case(op, "function", "float32", "backward", DEVICE, 2)
    assert result.status == "pass", result.detail

    def worse_on_turbine(x, *args, **kwargs):
        scale = {"cpu": 1 + 1e-3 if x.dtype == torch.float32 else 1.0, "turbine": 1 + 3e-3}.get(x.device.type, 1.0)
        return torch.sin(x * scale, *args, **kwargs)

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: worse_on_turbine)
    result = opinfo_runner.run_case(op, "function", "float32", "backward", DEVICE, 2)
    assert result.status == "fail" and "not close" in result.detail


@pytest.mark.skipif(not (DEVICE.startswith("turbine:cuda") and torch.cuda.is_available()), reason="needs a turbine GPU device and torch CUDA")
def test_on_a_gpu_a_gradient_that_matches_torch_cudas_passes(monkeypatch):
    op = ENTRIES["sin"]

    def as_on_a_gpu(x, *args, **kwargs):
        return torch.sin(x * (1 + 1e-3 if x.device.type in ("turbine", "cuda") else 1.0), *args, **kwargs)

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: as_on_a_gpu)
    result = opinfo_runner.run_case(op, "function", "float32", "backward", DEVICE, 2)
    assert result.status == "pass", result.detail

    def only_on_turbine(x, *args, **kwargs):
        return torch.sin(x * (1 + 1e-3 if x.device.type == "turbine" else 1.0), *args, **kwargs)

    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: only_on_turbine)
    result = opinfo_runner.run_case(op, "function", "float32", "backward", DEVICE, 2)
    assert result.status == "fail" and "not close" in result.detail


def test_a_result_left_on_the_cpu_fails_its_case(monkeypatch):
    op = ENTRIES["sin"]
    monkeypatch.setattr(opinfo_runner, "_variant", lambda op, variant: lambda x: torch.sin(x).cpu())
    result = opinfo_runner.run_case(op, "function", "float32", "forward", DEVICE, 2)
    assert result.status == "fail" and "not on the turbine device" in result.detail


def test_cases_torch_does_not_have_are_not_applicable():
    result = opinfo_runner.run_case(ENTRIES["cat"], "inplace", "float32", "forward", DEVICE, 2)
    assert result.status == "n/a" and "no inplace variant" in result.detail
    result = opinfo_runner.run_case(ENTRIES["bitwise_and"], "function", "float32", "forward", DEVICE, 2)
    assert result.status == "n/a" and "does not take torch.float32" in result.detail


def test_every_skip_names_an_entry_and_gives_a_reason():
    for (name, variant, dtype, direction), reason in SKIPS.items():
        assert name in ENTRIES, f"{name} is not an op_db entry"
        assert variant in (None, *opinfo_runner.VARIANTS)
        assert dtype in (None, *opinfo_runner.DTYPES)
        assert direction in (None, "forward", "backward")
        assert len(reason.split()) >= 4, f"the skip of {name} needs a real reason"


@pytest.mark.slow
@pytest.mark.timeout(600)  # two coverage runs that compile: beyond a GPU run's --timeout=150 under 15 workers
def test_an_interrupted_coverage_run_reports_what_it_finished_and_resumes(tmp_path):
    """A SIGTERM (a time limit) mid-run writes the finished entries' report naming the rest;
    --resume runs only the rest and adds them, so a long run can be split over several calls."""
    import json
    import signal
    import subprocess
    import sys

    names = ["neg", "abs", "sign", "square", "sgn", "frac"]
    # faulthandler: a crash at the process's exit (once a SIGABRT) shows every thread's stack here
    command = [sys.executable, "-X", "faulthandler", "-m", "turbine", "coverage", "--device", DEVICE, "--jobs", "1"]
    command += ["--samples", "1", "--out", str(tmp_path), "--ops", *names]
    run = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = ""
    while not first.startswith(names[0] + ":"):  # the line of the first entry finished (after any warning)
        first = run.stderr.readline()
        assert first, "the run ended before its first entry finished"
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1 and "add --resume" in err, err
    report = json.loads((tmp_path / "op-coverage.json").read_text())
    not_run = report["meta"]["not_run"]
    done = {r["op"] for r in report["results"]}
    assert names[0] in done and not_run and set(not_run) | done == set(names) and not set(not_run) & done
    assert "Interrupted" in (tmp_path / "op-coverage.md").read_text()

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    ran_again = [line.split(":")[0] for line in resumed.stderr.splitlines() if line.split(":")[0] in names]
    assert sorted(ran_again) == sorted(not_run)
    report = json.loads((tmp_path / "op-coverage.json").read_text())
    assert report["meta"]["not_run"] == [] and {r["op"] for r in report["results"]} == set(names)
    assert "Interrupted" not in (tmp_path / "op-coverage.md").read_text()


@pytest.mark.slow
def test_a_worker_whose_device_was_lost_is_replaced(tmp_path):
    """A kernel that faults loses the worker's GPU context; the next entries go to a new worker
    instead of failing one after another in the lost one. The loss is injected after one entry."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(opinfo_runner.__file__).parent)!r})\n"
        "import opinfo_runner\n"
        "from turbine.device import open_device\n"
        "run_entry = opinfo_runner.run_entry\n"
        "def losing(op, device, samples):\n"
        "    yield from run_entry(op, device, samples)\n"
        "    if opinfo_runner.entry_name(op) == os.environ['LOSE_AFTER']:\n"
        "        open_device(device).lost = 'injected: CUDA_ERROR_ILLEGAL_ADDRESS'\n"
        "opinfo_runner.run_entry = losing\n"
    )
    environment = dict(os.environ, LOSE_AFTER="neg", PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    command = [sys.executable, "-m", "turbine", "coverage", "--device", DEVICE, "--jobs", "1", "--samples", "1"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path), "--ops", "neg", "abs", "sign"], capture_output=True, text=True, timeout=300, env=environment
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "was lost in neg (injected: CUDA_ERROR_ILLEGAL_ADDRESS); a new worker goes on" in done.stderr
    import json

    results = json.loads((tmp_path / "op-coverage.json").read_text())["results"]
    forward = {r["op"]: r["status"] for r in results if (r["variant"], r["dtype"], r["direction"]) == ("function", "float32", "forward")}
    assert forward == {"neg": "pass", "abs": "pass", "sign": "pass"}
