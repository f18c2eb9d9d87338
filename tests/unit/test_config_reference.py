"""README's config reference is the one generated from the config class, so it cannot drift."""

from repo_paths import REPO

from r3_rllib.config import R3_FIELDS
from r3_rllib.config_reference import BEGIN, END, field_docs, render

README = REPO / "README.md"


def test_every_field_is_documented():
    docs = field_docs()
    assert set(docs) == R3_FIELDS, sorted(R3_FIELDS - set(docs))
    assert all(text.strip() for text in docs.values())


def test_readme_table_matches_generated(monkeypatch):
    monkeypatch.delenv(
        "R3_CPU_THREADS", raising=False
    )  # the suite sets it (tests/conftest.py); README shows 'auto'
    text = README.read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render(), "README config reference is stale: run scripts/update_readme.py"
