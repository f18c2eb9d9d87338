"""The three private RLlib/Tune names r3-rllib relies on, each for a reason its use site states. RLlib does not
promise them: these tests fail first when an RLlib upgrade moves one, instead of a run failing mid-training."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("ray.rllib")


def test_env_runner_group_keeps_a_fault_tolerant_manager_that_can_mark_actors_unhealthy():
    # r3.py `_restart_hung_runners`: RLlib has no public call that takes a hung (not crashed) runner out of service.
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.utils.actor_manager import FaultTolerantActorManager

    assert "self._worker_manager = FaultTolerantActorManager(" in inspect.getsource(EnvRunnerGroup)
    params = inspect.signature(FaultTolerantActorManager.set_actor_state).parameters
    assert list(params) == ["self", "actor_id", "healthy"]
    assert callable(FaultTolerantActorManager.actors)


def test_torch_learner_wraps_modules_through_an_overridable_ddp_hook():
    # learner.py `_make_modules_ddp_if_necessary`: overridden to a no-op so RLlib's DDP does not wrap the policy
    # that R3Learner shards with FSDP2 itself.
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

    from r3_rllib.algorithms.r3.learner import R3Learner

    assert "self._make_modules_ddp_if_necessary()" in inspect.getsource(TorchLearner.build)
    assert R3Learner._make_modules_ddp_if_necessary is not TorchLearner._make_modules_ddp_if_necessary


def test_tune_global_registry_resolves_env_creators():
    # env_runner.py `_text_env_factory`: a TextEnv registered only in the driver reaches remote runners through
    # Tune's cluster-wide registry, which has no public lookup.
    from ray.tune.registry import ENV_CREATOR, _global_registry, register_env

    register_env("r3_private_api_probe", lambda cfg: cfg)
    assert _global_registry.contains(ENV_CREATOR, "r3_private_api_probe")
    assert _global_registry.get(ENV_CREATOR, "r3_private_api_probe")({"x": 1}) == {"x": 1}
