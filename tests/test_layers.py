"""The package's layers (ARCHITECTURE.md): imports run one way, and none hides in a function."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

import turbine

PACKAGE = pathlib.Path(turbine.__file__).parent
ROOT = PACKAGE.parent


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter is not installed (pip install -e '.[test]')")
def test_import_linter_contracts_hold():
    """setup.cfg's contracts: layers downwards, eager/ without IREE, no circle inside a package."""
    result = subprocess.run(
        [shutil.which("lint-imports"), "--config", str(ROOT / "setup.cfg"), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": str(pathlib.Path(sys.executable).parent)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and result.stdout.count("KEPT") >= 3


def _function_level_imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """``module:line`` of each import of a turbine module inside a function or class body."""
    tree = ast.parse(path.read_text())
    found: dict[str, None] = {}  # a method's imports are inside its class too: each once
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for inner in ast.walk(node):
            names = []
            if isinstance(inner, ast.Import):
                names = [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom):
                names = ["turbine" if inner.level else inner.module or ""]
            if any(name == "turbine" or name.startswith("turbine.") for name in names):
                found[f"{path.relative_to(root)}:{inner.lineno}"] = None
    return list(found)


def test_no_turbine_import_hides_in_a_function():
    """An import inside a function is how a circle of imports gets dodged: the linter above
    sees it, and this test names it."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _function_level_imports(path)]
    assert found == []


def test_the_check_finds_a_hidden_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import turbine.device\n"
        "def f():\n    from turbine.eager import dispatch\n    import os\n    return dispatch\n"
        "class C:\n    def g(self):\n        from .. import config\n"
    )
    assert _function_level_imports(module, tmp_path) == ["m.py:3", "m.py:8"]
