"""An env option the env does not take (a misspelt ``env_config`` key) is refused by ``R3Config.validate()``, so a
config built in Python is refused by ``build_algo()`` before Ray starts, with the message ``r3 train`` gives for a
run file, instead of by every EnvRunner after Ray and the model started. Envs whose options cannot be read here
(``**kwargs`` factories, names this process does not know) and Ray Tune's search-space placeholders pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray
from ray import tune
from ray.tune.search.variant_generator import generate_variants

from r3_rllib import R3Config
from r3_rllib.envs.arithmetic import ArithmeticEnv

MISSPELT = r"environment\.env_config: env 'arithmetic' takes no option 'digitz'; did you mean 'digits'\?"


def _kwargs_factory(**kwargs) -> ArithmeticEnv:
    """A factory whose options are the env's it hands them to: unreadable here."""
    return ArithmeticEnv(**kwargs)


class _KwargsEnv(ArithmeticEnv):
    """An env class forwarding ``**kwargs`` to its base."""

    def __init__(self, *, label: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.label = label


def test_build_algo_refuses_a_misspelt_env_option_before_ray_starts(monkeypatch):
    """Was: ``__init__() got an unexpected keyword argument 'digitz'`` from every EnvRunner, after Ray started."""
    from r3_rllib.algorithms.r3.console import R3Console

    assert not ray.is_initialized()

    # The step that starts Ray (console.py): the config's validation must refuse it before.
    def _setup_reached(self, config) -> None:
        raise AssertionError("the algorithm's setup ran: the config was not refused by its validation")

    monkeypatch.setattr(R3Console, "setup", _setup_reached)
    config = R3Config.grpo_preset().environment("arithmetic", env_config={"digitz": 2})
    with pytest.raises(ValueError, match=MISSPELT):
        config.build_algo()
    assert not ray.is_initialized()


def test_validate_names_the_closest_option_or_lists_them():
    with pytest.raises(ValueError, match=MISSPELT):
        R3Config().environment("arithmetic", env_config={"digitz": 2}).validate()
    with pytest.raises(ValueError, match=r"takes no option 'zzz'; its options: .*digits"):
        R3Config().environment("arithmetic", env_config={"zzz": 2}).validate()


def test_options_the_env_takes_pass():
    R3Config().environment("arithmetic", env_config={"digits": 2, "num_queries": 8, "seed": 3}).validate()
    R3Config().environment(ArithmeticEnv, env_config={"digits": 2}).validate()


def test_an_env_class_or_module_path_is_checked_by_its_signature():
    with pytest.raises(
        ValueError, match=r"env 'ArithmeticEnv' takes no option 'digitz'; did you mean 'digits'"
    ):
        R3Config().environment(ArithmeticEnv, env_config={"digitz": 2}).validate()
    path = "r3_rllib.envs.arithmetic:ArithmeticEnv"
    with pytest.raises(ValueError, match=rf"env '{path}' takes no option 'digitz'"):
        R3Config().environment(path, env_config={"digitz": 2}).validate()


@pytest.fixture
def kwargs_factory_name(monkeypatch) -> Iterator[str]:
    """A name registered for :func:`_kwargs_factory` in a text-env registry of the test's own (and in Ray Tune's,
    where ``R3Config.environment`` puts a name registered only here; taken out after)."""
    from ray.tune.registry import ENV_CREATOR, _global_registry

    from r3_rllib.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", registry.new_text_env_registry())
    registry.register_text_env("kwargs_factory", _kwargs_factory)
    yield "kwargs_factory"
    _global_registry.unregister(ENV_CREATOR, "kwargs_factory")


def test_a_kwargs_factory_is_left_to_the_runners(kwargs_factory_name):
    R3Config().environment(kwargs_factory_name, env_config={"digits": 2, "anything": 1}).validate()


def test_a_kwargs_env_class_is_left_to_the_runners():
    R3Config().environment(_KwargsEnv, env_config={"digits": 2, "label": "x", "anything": 1}).validate()


def test_a_name_this_process_does_not_know_is_left_to_the_runners():
    """A name only Ray Tune's registry (or the cluster's nodes) knows: its options cannot be read here."""
    R3Config().environment("only_on_the_workers", env_config={"whatever": 1}).validate()


def test_eval_env_config_is_not_checked():
    """Its default {split: test} is for envs with a held-out split; the others ignore it."""
    R3Config().environment("arithmetic", env_config={"digits": 2}).training(
        eval_env_config={"split": "test", "unused": 1}
    ).validate()


def test_grid_search_placeholders_pass_and_each_whole_env_config_choice_is_checked():
    R3Config().environment("arithmetic", env_config={"digits": tune.grid_search([1, 2])}).validate()
    choices = tune.grid_search([{"digits": 1}, {"digits": 2, "num_queries": 4}])
    R3Config().environment("arithmetic", env_config=choices).validate()
    with pytest.raises(ValueError, match=MISSPELT):
        R3Config().environment(
            "arithmetic", env_config=tune.grid_search([{"digits": 1}, {"digitz": 2}])
        ).validate()


def test_each_trial_of_a_tune_sweep_over_env_config_validates():
    """``tune.Tuner("R3", param_space=config)`` turns the config into a dict (no validation), resolves the grid
    search per trial, and each trial's Algorithm builds and validates its config from the resolved dict."""
    config = R3Config().environment(
        "arithmetic", env_config={"digits": tune.grid_search([1, 2]), "num_queries": 8}
    )
    trials = [resolved for _, resolved in generate_variants(config.to_dict())]
    assert [t["env_config"]["digits"] for t in trials] == [1, 2]
    for resolved in trials:
        trial_config = R3Config().update_from_dict(resolved)
        trial_config.validate()
        assert trial_config.env_config == {"digits": resolved["env_config"]["digits"], "num_queries": 8}
