"""examples/openai_agent_cpu.yaml builds its agent env as a user runs it (from the repository root, with
``PYTHONPATH=examples``): the task file is found beside the run file whatever the working directory."""

from __future__ import annotations

from pathlib import Path

from repo_paths import REPO

from r3_rllib.train_config import load_run_file

EXAMPLES = REPO / "examples"


def test_the_openai_agent_example_builds_its_env_from_any_directory(monkeypatch, tmp_path):
    from r3_rllib.envs import make_text_env
    from r3_rllib.envs.base import supports_agent_runs

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.chdir(tmp_path)  # ./sums.jsonl is resolved against the run file's folder, not this one
    config = load_run_file(EXAMPLES / "openai_agent_cpu.yaml").config
    assert Path(config.env_config["tasks"]) == (EXAMPLES / "sums.jsonl").resolve()
    env = make_text_env(config.env, **config.env_config)
    rows = sum(1 for line in (EXAMPLES / "sums.jsonl").read_text().splitlines() if line.strip())
    assert supports_agent_runs(env) and len(env.query_ids) == rows - round(0.2 * rows)
    task = env.agent_task(env.reset(seed=0)[1]["query_id"])
    assert {"question", "answer"} <= set(task)
