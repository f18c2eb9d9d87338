"""Paths the tests use, independent of how deep a test file sits under tests/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
