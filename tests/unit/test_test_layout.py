"""The test tree collects in one process: `bash scripts/test.sh -m "not slow"` runs pytest over tests/unit and
tests/e2e together, and pytest's default import mode (no __init__.py files) refuses two test modules with one
basename ("import file mismatch"), which broke that command once (tests/e2e/test_health.py beside
tests/unit/core/test_health.py)."""

from __future__ import annotations

from collections import Counter

from repo_paths import REPO


def test_every_test_module_basename_is_unique():
    names = Counter(p.name for p in (REPO / "tests").rglob("*.py") if "__pycache__" not in p.parts)
    assert [name for name, n in names.items() if n > 1 and name != "conftest.py"] == []
