"""The notebooks run from top to bottom."""

import re
from pathlib import Path

import pytest

# The GPU machine has no Jupyter: the notebooks are checked on the CPU machines (CI).
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the notebooks run in CI)")
NotebookClient = pytest.importorskip("nbclient", reason="nbclient is not installed (the notebooks run in CI)").NotebookClient

pytestmark = pytest.mark.slow  # each notebook runs in a new kernel

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _run(name: str) -> list:
    """Execute a notebook in a fresh kernel; its code cells' outputs, none of them an error."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, "\n".join(f"{e['ename']}: {e['evalue']}" for e in errors)
    return outputs


def _text(outputs: list) -> str:
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in outputs)


def test_quickstart_notebook_runs():
    text = _text(_run("01-quickstart.ipynb"))
    assert "turbine:0" in text and "torch.int64" in text
    assert "IProgress not found" not in text and "TqdmWarning" not in text  # the progress bar is a widget


def test_training_notebook_trains_plots_and_evaluates():
    outputs = _run("02-training.ipynb")
    text = _text(outputs)
    first, last = (float(v) for v in re.search(r"loss: first epoch ([\d.]+), last epoch ([\d.]+)", text).groups())
    assert last < first / 2, "the loss falls"
    assert any("image/png" in o.get("data", {}) for o in outputs), "the loss is plotted"
    accuracy = float(re.search(r"test accuracy: ([\d.]+)%", text).group(1))
    assert accuracy > 80
    agreement = float(re.search(r"agrees on ([\d.]+)% of the points", text).group(1))
    assert agreement > 99
    compiled = [int(v) for v in re.search(r"kernels compiled by the end of each epoch: \[([\d, ]+)\]", text).group(1).split(",")]
    assert compiled[-1] == compiled[0], "no epoch after the first compiles anything"
    assert "{}" in text  # no fallbacks
