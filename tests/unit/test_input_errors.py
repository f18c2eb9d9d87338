"""Bad input is refused with a message naming the setting and its rule, by the same rule in the Python path
(`R3Config.validate`, `build_algo`) and in the CLI path (`load_run_file`, `--set`, `r3 train`)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from r3_rllib.algorithms.r3.config import ALGORITHM_FIELD_RULES, R3Config
from r3_rllib.config import RLLIB_FIELD_RULES, R3Settings, field_rule
from r3_rllib.train_config import ConfigError, load_run_file

#: The run-file section that sets each RLlib setting with a rule.
RLLIB_SECTIONS = {
    "lr": "training",
    "num_epochs": "training",
    "grad_clip": "training",
    "num_learners": "learners",
    "num_cpus_per_learner": "learners",
    "num_gpus_per_learner": "learners",
    "num_env_runners": "env_runners",
    "env_config": "environment",
    "num_cpus_per_env_runner": "env_runners",
    "num_gpus_per_env_runner": "env_runners",
    "seed": "debugging",
}

#: (section, key, value, what the message must say): the values found to load or run before.
BAD_VALUES = [
    ("training", "lr", -1e-4, "lr must be finite and > 0"),
    ("training", "lr", "abc", "lr must be a number"),
    ("training", "temperature", -0.5, "temperature must be finite and > 0"),
    ("training", "kl_coef", -0.1, "kl_coef must be finite and >= 0"),
    ("training", "entropy_coef", -0.001, "entropy_coef must be finite and >= 0"),
    ("training", "entropy_coef", float("nan"), "entropy_coef must be finite and >= 0"),
    ("training", "top_entropy_quantile", 0.0, "top_entropy_quantile must be"),
    ("training", "top_entropy_quantile", 1.5, "top_entropy_quantile must be"),
    ("training", "max_new_tokens", -5, "max_new_tokens must be >= 1"),
    ("training", "top_p", 2, "top_p must be in (0, 1]"),
    ("training", "num_epochs", 0, "num_epochs must be >= 1"),
    ("learners", "num_learners", -2, "num_learners must be >= 0"),
    ("debugging", "seed", "abc", "seed must be a number"),
    ("training", "replay", "yes", "replay must be true or false"),
    ("training", "rollout_timeout_s", 0, "rollout_timeout_s must be finite and > 0 or None"),
    # Found accepted, then failing in the learner or in every runner (or moving the weights to inf):
    ("training", "dtype", "floaty", "dtype must be one of"),
    ("training", "dtype", "float16", "gradient scaler"),
    ("training", "rollout_head_lr", float("inf"), "rollout_head_lr must be finite and > 0 or None"),
    ("training", "rollout_head_skip_range", float("inf"), "rollout_head_skip_range must be finite"),
]

#: Values refused by a rule of the whole config (RLlib's evaluation copy is exempt from it, or the value is a
#: schedule): the message names the setting, not the run file's section.
BAD_CONFIGS = [
    # RLlib's local runner is never asked: 0 remote runners failed at the first rollout ("no healthy EnvRunner").
    ("env_runners", "num_env_runners", 0, "num_env_runners must be >= 1"),
    ("training", "lr", [[0, 1e-5], [100, -1e-6]], "lr schedule values must be >= 0"),
    ("training", "lr", [[0, 1e-5], [100, "x"]], "lr schedule points must be [timestep, value] pairs"),
    ("training", "engine_kwargs", {"gpu_memory_utilization": 0.5}, "are not options of the 'hf' engine"),
    ("training", "engine_kwargs", {"dtype": "bfloat16"}, "engine_kwargs may not set ['dtype']"),
    ("training", "reflection_template", "{query} only", "must contain the {query} and {wrong_answer}"),
    ("training", "reflection_template", "{query} {wrong_answer} {oops}", "bad reflection template"),
    ("environment", "env_config", [1, 2], "env_config must be a mapping"),
    ("training", "sleep_between_rollouts", True, "does nothing with engine 'hf'"),
]


def _rule(name: str):
    if name in ALGORITHM_FIELD_RULES:
        return ALGORITHM_FIELD_RULES[name]
    if name in RLLIB_FIELD_RULES:
        return RLLIB_FIELD_RULES[name]
    return field_rule(next(f for f in dataclasses.fields(R3Settings) if f.name == name))


ALL_SETTINGS = sorted({f.name for f in dataclasses.fields(R3Settings)} | set(RLLIB_FIELD_RULES))
MINUS_ONE_OK = [n for n in ALL_SETTINGS if _rule(n) is not None and _rule(n).error(n, -1) is None]
MINUS_ONE_BAD = [n for n in ALL_SETTINGS if n not in MINUS_ONE_OK]


def _section(name: str) -> str:
    return RLLIB_SECTIONS.get(name, "training")


def _configured(name: str, value) -> R3Config:
    config = R3Config()
    getattr(config, _section(name))(**{name: value})
    return config


@pytest.fixture
def run_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("training: {group_size: 4}\nstop: {training_iteration: 1}\n")
    return path


def test_the_settings_split_over_minus_one():
    # -1 means "off" for top_k, "no limit" for max_num_gen_batches (verl's <= 0) and is a plain number for
    # hgpo_alpha; every other setting refuses it.
    assert MINUS_ONE_OK == ["hgpo_alpha", "max_num_gen_batches", "top_k"]
    assert len(MINUS_ONE_BAD) > 100


@pytest.mark.parametrize("name", MINUS_ONE_BAD)
def test_minus_one_is_refused_naming_the_field_in_python(name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        _configured(name, -1).validate()


@pytest.mark.parametrize("name", MINUS_ONE_BAD)
def test_minus_one_is_refused_naming_the_field_in_the_cli(name, run_file):
    with pytest.raises(ConfigError, match=rf"\b{name}\b"):
        load_run_file(run_file, [f"{_section(name)}.{name}=-1"])


#: The modes that read the settings of MINUS_ONE_OK (set while their mode is off, they are refused:
#: r3_rllib/config/mode_options.py).
MINUS_ONE_MODES = {"advantage_estimator": "hgpo", "dynamic_sampling": True}


def test_minus_one_survives_the_state_round_trip_of_algorithm_init():
    # Algorithm.__init__ rebuilds its config with from_state(get_state()); RLlib's get_state drops values == -1.
    config = R3Config().training(**MINUS_ONE_MODES)
    for name in MINUS_ONE_OK:
        getattr(config, _section(name))(**{name: -1})
    copy = R3Config.from_state(config.get_state())
    assert {n: getattr(copy, n) for n in MINUS_ONE_OK} == dict.fromkeys(MINUS_ONE_OK, -1)
    copy.validate()


class _Built(Exception):
    """Raised by a stubbed `R3.setup` with the config the algorithm was built with (no Ray, no actors)."""


def test_build_algo_keeps_minus_one_and_refuses_it_where_invalid(monkeypatch):
    from r3_rllib.algorithms.r3.r3 import R3

    def setup(self, config):
        raise _Built(self.config)

    monkeypatch.setattr(R3, "setup", setup)
    config = R3Config().training(**MINUS_ONE_MODES, **dict.fromkeys(MINUS_ONE_OK, -1))
    with pytest.raises(_Built) as built:
        config.build_algo()
    assert {n: getattr(built.value.args[0], n) for n in MINUS_ONE_OK} == dict.fromkeys(MINUS_ONE_OK, -1)
    monkeypatch.undo()  # the real setup validates
    for name in ("temperature", "max_new_tokens", "clip_low"):
        with pytest.raises(ValueError, match=rf"{name} must be"):
            R3Config().training(**{name: -1}).build_algo()


@pytest.mark.parametrize(("section", "key", "value", "message"), BAD_VALUES)
def test_a_bad_value_is_refused_in_python(section, key, value, message):
    config = R3Config()
    try:
        getattr(config, section)(**{key: value})
    except ValueError as e:  # RLlib's builder refusing it first is fine too: it must still name the key
        assert key in str(e)
        return
    with pytest.raises(ValueError, match=rf"\b{key}\b") as error:
        config.validate()
    assert message in str(error.value)


@pytest.mark.parametrize(("section", "key", "value", "message"), BAD_VALUES)
def test_a_bad_value_is_refused_in_a_run_file(section, key, value, message, tmp_path):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({section: {key: value}}))
    with pytest.raises(ConfigError) as error:
        load_run_file(path)
    assert f"section {section!r}: " in str(error.value) and message in str(error.value)


@pytest.mark.parametrize(("section", "key", "value", "message"), BAD_VALUES)
def test_a_bad_value_is_refused_in_a_set_override(section, key, value, message, run_file):
    import yaml

    text = f"{section}.{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
    with pytest.raises(ConfigError) as error:
        load_run_file(run_file, [text])
    assert str(error.value).startswith(f"--set {text}: ") and message in str(error.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("stop.training_iteration=-1", "stop.training_iteration must be >= 1"),
        ("stop.training_iteration=0", "stop.training_iteration must be >= 1"),
        ("stop.time_total_s=-3", "stop.time_total_s must be finite and > 0"),
        (
            "stop.episodes=5",
            "unknown key 'episodes' in section 'stop'; known keys: num_env_steps_sampled_lifetime",
        ),
        ("stop.training_iter=5", "did you mean 'training_iteration'?"),
        ("run.checkpoint_frequency=often", "run.checkpoint_frequency must be a number (>= 0), got 'often'"),
        ("run.checkpoint_at_end=maybe", "run.checkpoint_at_end must be true or false"),
        ("run.num_samples=0", "run.num_samples must be >= 1"),
        ("run.name=12", "run.name must be a string"),
    ],
)
def test_run_and_stop_keys_have_a_declared_schema(override, message, run_file, tmp_path):
    with pytest.raises(ConfigError, match="^--set ") as error:
        load_run_file(run_file, [override])
    assert message in str(error.value)
    section, rest = override.split(".", 1)
    key, value = rest.split("=", 1)
    path = tmp_path / "file.yaml"
    path.write_text(f"{section}:\n  {key}: {value}\n")
    with pytest.raises(ConfigError) as error:
        load_run_file(path)
    assert message in str(error.value)


def test_good_run_and_stop_keys_load(run_file):
    spec = load_run_file(
        run_file,
        ["stop.time_total_s=60", "run.checkpoint_frequency=2", "run.verbose=0", "training.top_k=-1"],
    )
    assert spec.stop == {"training_iteration": 1, "time_total_s": 60}
    assert spec.run == {"checkpoint_frequency": 2, "verbose": 0} and spec.config.top_k == -1


def test_a_set_value_that_is_not_yaml_is_named(run_file):
    with pytest.raises(ConfigError, match=r"^--set training\.lr=\[: not a YAML value"):
        load_run_file(run_file, ["training.lr=["])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.lr=abc", "r3 train: --set training.lr=abc: lr must be a number"),
        ("training.lr=[", "r3 train: --set training.lr=[: not a YAML value"),
        ("learners.num_learners=-2", "r3 train: --set learners.num_learners=-2: num_learners must be >= 0"),
    ],
)
def test_r3_train_exits_2_on_a_malformed_set_value(override, message, run_file, capsys):
    from r3_rllib.cli import main

    assert main(["train", str(run_file), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and "Traceback" not in err


def test_r3_train_exits_2_on_a_bad_default_from_the_environment(run_file, capsys, monkeypatch):
    from r3_rllib.cli import main

    monkeypatch.setenv("R3_CPU_THREADS", "fast")
    assert main(["train", str(run_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("r3 train: R3_CPU_THREADS='fast' in the environment") and "Traceback" not in err


def test_rollout_timeout_is_finite_by_default():
    # A hanging reward function or engine is bounded by default (None still opts out).
    assert R3Config().rollout_timeout_s == 1800
    R3Config().training(rollout_timeout_s=None).validate()


@pytest.mark.parametrize(("section", "key", "value", "message"), BAD_CONFIGS)
def test_a_bad_config_is_refused_in_python_and_in_a_run_file(section, key, value, message, tmp_path):
    import yaml

    with pytest.raises(ValueError, match=rf"\b{key}\b") as error:
        getattr(R3Config(), section)(**{key: value}).validate()
    assert message in str(error.value)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({section: {key: value}}))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_run_file(path)


def test_sleep_between_rollouts_needs_vllms_sleep_mode():
    """vLLM ignores sleep() unless built with sleep mode: the memory a colocated learner counts on stays taken."""
    config = R3Config().training(engine="vllm", sleep_between_rollouts=True)
    with pytest.raises(ValueError, match="needs engine_kwargs enable_sleep_mode: true"):
        config.validate()
    config.training(engine_kwargs={"enable_sleep_mode": True}).validate()
