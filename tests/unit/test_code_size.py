"""Size limits that keep the package readable: no function over 70 lines (docstring included) anywhere in r3_rllib,
no module of the Ray/RLlib layer (algorithms/) over 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "r3_rllib"
MAX_FUNCTION_LINES = 70
MAX_ALGORITHMS_MODULE_LINES = 500


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
