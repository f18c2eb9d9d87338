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


#: The adapter run files whose env is a user module in examples/ (run with PYTHONPATH=examples), and the extra the
#: adapter needs.
ADAPTER_RUN_FILES = {"openenv_sums.yaml": "openenv", "verifiers_sums.yaml": "verifiers.v1"}


@pytest.mark.slow  # importing verifiers takes ~6 s
@pytest.mark.parametrize("name", sorted(ADAPTER_RUN_FILES))
def test_adapter_example_builds_its_env(name, monkeypatch):
    """The env of an adapter run file builds from its user module in examples/ (as `PYTHONPATH=examples` gives the
    runners), with every task in its pool."""
    pytest.importorskip(ADAPTER_RUN_FILES[name])
    from r3_rllib.envs import make_text_env
    from r3_rllib.envs.base import supports_agent_runs

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    config = load_run_file(REPO / "examples" / name).config
    env = make_text_env(config.env, **config.env_config)
    assert supports_agent_runs(env) and len(env.query_ids) == 256
    prompt, info = env.reset(seed=0)
    assert prompt and info["query_id"] in env.query_ids
