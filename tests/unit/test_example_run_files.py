"""Every run file in examples/ loads into a config that validates (no model is built, nothing is trained)."""

from __future__ import annotations

import pytest
from repo_paths import REPO

from r3_rllib.train_config import load_run_file

RUN_FILES = sorted((REPO / "examples").glob("*.yaml"))
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.mark.parametrize("path", RUN_FILES, ids=[p.name for p in RUN_FILES])
def test_example_run_file_loads_and_validates(path):
    if "shared/data" in path.read_text() and not SHARED_DATA.is_dir():
        pytest.skip(f"{path.name} reads the shared data folder ({SHARED_DATA}), which is absent")
    spec = load_run_file(path)
    spec.config.validate()
    assert spec.stop and spec.run.get("name")


def test_the_env_examples_use_the_envs_users_have():
    envs = {load_run_file(p).config.env for p in RUN_FILES if "shared/data" not in p.read_text()}
    assert {"reasoning_gym", "textworld"} <= envs
