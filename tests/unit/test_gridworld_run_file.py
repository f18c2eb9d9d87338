"""The multi-step example run file loads into the HGPO config it describes (no model is built)."""

from repo_paths import REPO

from r3_rllib.envs.gridworld import GridWorldEnv
from r3_rllib.models.hub import named_models
from r3_rllib.train_config import load_run_file


def test_gridworld_hgpo_run_file_builds_a_valid_hgpo_config():
    spec = load_run_file(REPO / "examples" / "gridworld_hgpo_cpu.yaml")
    config = spec.config
    config.validate()
    assert (
        config.env == "gridworld" and config.advantage_estimator == "hgpo" and config.hgpo_setting == "hgpo"
    )
    assert not (config.replay or config.reflection or config.ranking)
    assert config.model_path in named_models()
    # The env it names is the preset the warm start was trained on, and a move fits in max_new_tokens.
    env = GridWorldEnv(**config.env_config)
    assert env.settings["max_steps"] == 20 and env.size == 6
    assert config.max_new_tokens >= len("right") + 1
