"""Size limits that keep the package readable: no function over 70 lines (docstring included) anywhere in r3_rllib,
no module of the Ray/RLlib layer (algorithms/) over 500 lines. The lines counted are formatted ones: the package
passes ``ruff format --check`` and holds no ``fmt: skip`` / ``fmt: off`` pragma (nor does any other file of the
repository), so a limit cannot be met by collapsing lines by hand."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "r3_rllib"
MAX_FUNCTION_LINES = 70
MAX_ALGORITHMS_MODULE_LINES = 500
FORMAT_PRAGMA = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def test_no_function_over_70_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 70 lines: " + "; ".join(long)


def test_no_algorithms_module_over_500_lines():
    big = [
        f"{path.relative_to(PACKAGE)} ({n} lines)"
        for path in sorted((PACKAGE / "algorithms").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_ALGORITHMS_MODULE_LINES
    ]
    assert not big, "algorithms/ modules over 500 lines: " + ", ".join(big)


def test_no_formatter_pragma_anywhere():
    """Not in the package (the size limits count formatted lines) nor in the tests, benchmarks, scripts and
    examples: every file reads as ``ruff format`` writes it."""
    found = [
        f"{path.relative_to(REPO)}:{i}"
        for folder in ("r3_rllib", "tests", "bench", "scripts", "examples")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path != Path(__file__).resolve()  # this file names the pragma
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if FORMAT_PRAGMA.search(line)
    ]
    assert not found, "fmt: skip / fmt: off: " + ", ".join(found)


def _ruff() -> list[str] | None:
    """The command that runs ruff: this interpreter's ``ruff`` module, else the executable beside the interpreter;
    None when neither is installed."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    beside = Path(sys.executable).with_name("ruff")
    return [str(beside)] if beside.is_file() else None


def test_the_package_is_formatted():
    """The line counts above are of formatted code: ``ruff format --check r3_rllib`` (pyproject's settings)."""
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the test extra: pip install -e '.[test]')")
    out = subprocess.run(
        [*ruff, "format", "--check", "r3_rllib"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, f"ruff format --check r3_rllib:\n{out.stdout}{out.stderr}"
