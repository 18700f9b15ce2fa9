"""Checkpoints: torch.save / torch.load, pickle and copy.deepcopy of turbine tensors, modules and
optimizers (issue 19, item 3)."""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

from checks import D


def roundtrip(value, **load_options):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_options)


def test_a_saved_tensor_loads_back_on_its_device():
    x = torch.randn(3, 5)
    loaded = roundtrip({"x": x.to(D), "view": x.to(D)[:, 1::2]})
    assert loaded["x"].device == torch.device(D) and loaded["view"].device == torch.device(D)
    torch.testing.assert_close(loaded["x"].cpu(), x)
    torch.testing.assert_close(loaded["view"].cpu(), x[:, 1::2])


@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), "turbine:cpu", {"turbine:cpu": "cpu"}])
def test_map_location_moves_what_is_loaded(where):
    x = torch.randn(4, 2, dtype=torch.bfloat16)
    loaded = roundtrip(x.to("turbine:cpu"), map_location=where)
    expected = "turbine:cpu" if where == "turbine:cpu" else "cpu"
    assert loaded.device == torch.device(expected) and loaded.dtype == torch.bfloat16
    torch.testing.assert_close(loaded.cpu(), x)


def test_pickle_and_deepcopy_keep_values_device_and_grad_flag():
    x = torch.randn(2, 3).to(D).requires_grad_()
    for copied in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert copied.device == x.device and copied.requires_grad and copied.is_leaf
        torch.testing.assert_close(copied.detach().cpu(), x.detach().cpu())
    deep = copy.deepcopy(x)
    with torch.no_grad():
        deep.add_(1)  # its own buffer: the original is untouched
    torch.testing.assert_close(x.detach().cpu() + 1, deep.detach().cpu())
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _step(model, optimizer, x, y) -> float:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def test_module_state_dict_and_optimizer_state_save_and_load():
    model = _model().to(D)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(5, 6).to(D), torch.randn(5, 2).to(D)
    _step(model, optimizer, x, y)
    checkpoint = roundtrip({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    assert all(t.device == torch.device(D) for t in checkpoint["model"].values())
    twin = _model().to(D)
    twin.load_state_dict(checkpoint["model"])
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=0.01)
    twin_optimizer.load_state_dict(checkpoint["optimizer"])
    assert _step(twin, twin_optimizer, x, y) == pytest.approx(_step(model, optimizer, x, y), rel=1e-6)
    on_cpu = roundtrip(model.state_dict(), map_location="cpu")
    plain = _model()
    plain.load_state_dict(on_cpu)
    torch.testing.assert_close(plain(x.cpu()), model(x).detach().cpu())


def test_a_whole_module_pickles_with_its_parameters():
    model = _model().to(D)
    copied = roundtrip(model, weights_only=False)
    assert all(isinstance(p, torch.nn.Parameter) and p.device == torch.device(D) for p in copied.parameters())
    deep = copy.deepcopy(model)
    assert all(isinstance(p, torch.nn.Parameter) for p in deep.parameters())
    x = torch.randn(3, 6).to(D)
    torch.testing.assert_close(copied(x).detach().cpu(), model(x).detach().cpu())
    torch.testing.assert_close(deep(x).detach().cpu(), model(x).detach().cpu())


RESUME = """
import json, sys, torch, turbine
sys.path.insert(0, {tests!r})
from test_serialization import _model, _step
steps, path, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.manual_seed(1)
data = [(torch.randn(5, 6).to("turbine:cpu"), torch.randn(5, 2).to("turbine:cpu")) for _ in range(6)]
model = _model().to("turbine:cpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
start = 0
if mode == "resume":
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
losses = [_step(model, optimizer, *data[i]) for i in range(start, steps)]
if mode == "save":
    torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(), step=steps), path)
print(json.dumps(losses))
"""


@pytest.mark.slow  # new processes
def test_training_saved_midway_resumes_in_a_new_process_with_the_same_losses(tmp_path):
    script = RESUME.format(tests=os.path.dirname(__file__))
    path = str(tmp_path / "checkpoint.pt")

    def run(steps: int, mode: str) -> list[float]:
        result = subprocess.run([sys.executable, "-c", script, str(steps), path, mode], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    unbroken = run(6, "none")
    first = run(3, "save")
    second = run(6, "resume")
    assert first + second == pytest.approx(unbroken, rel=1e-6)
