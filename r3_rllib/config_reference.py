"""Render the R3Config reference (every R3 field, its default and its docstring) as a markdown table.

`python -m r3_rllib.config_reference` prints it; README.md holds the output between two markers and a test checks
that they agree, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import ast
import inspect

BEGIN = "<!-- config-reference:begin -->"
END = "<!-- config-reference:end -->"


def field_docs() -> dict[str, str]:
    """Attribute docstrings of R3Settings (the string literal right after each field)."""
    from r3_rllib.config import settings as module

    tree = ast.parse(inspect.getsource(module.R3Settings))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def render() -> str:
    from r3_rllib.config import default_values

    docs = field_docs()
    rows = ["| field | default | meaning |", "|---|---|---|"]
    for name, default in default_values().items():
        shown = repr(default)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        rows.append(f"| `{name}` | `{shown}` | {docs.get(name, '').replace('|', '/')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(render())
