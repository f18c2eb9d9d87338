"""Every private RLlib/Tune name r3-rllib touches, each checked for existence and the kind or signature we rely on.

RLlib does not promise these names: these tests fail first when a Ray upgrade moves one, instead of a run failing
mid-training. The list (found by grepping r3_rllib/, bench/ and examples/ for underscore names of Ray objects; bench/
and examples/ use none):

==  =======================================================  ==============================================================
#   name                                                     used in
==  =======================================================  ==============================================================
1   ``EnvRunnerGroup._worker_manager``                       coordinator.py ``_restart_hung_runners``, startup.py
    (a ``FaultTolerantActorManager``: ``actors()``,          ``runner_startup_error``: no public call marks a hung runner
    ``set_actor_state(actor_id, healthy)``)                  unhealthy or lists the handles of unhealthy runners
2   ``TorchLearner._make_modules_ddp_if_necessary``          learner.py: overridden to a no-op so RLlib's DDP does not wrap
                                                             the policy that R3Learner shards with FSDP2 itself
3   ``ray.tune.registry._global_registry``                   runner_setup.py ``_text_env_factory``: envs registered in the
    (``contains``, ``get``)                                  driver reach remote runners; Tune has no public lookup
4   ``Algorithm._counters``                                  r3.py ``restore_env_runners``: counts restored runners as
                                                             RLlib's own restore does
5   ``Trainable._iteration``                                 checkpointing.py ``load_checkpoint``: restores the
                                                             iteration count (``Algorithm.iteration`` reads it)
6   ``Learner._is_built``                                    learner.py ``R3Learner.build`` (replaces ``Learner.build``
7   ``Learner._device``                                      without calling it, so it sets the attributes the base
8   ``Learner._module``                                      class's other methods read)
9   ``TorchLearner._make_module``                            learner.py ``R3Learner.build``: builds the RLModule
10  ``RLModule._forward``                                    rl_module.py ``CausalLMModule``: the forward hook RLlib's
                                                             docstrings tell subclasses to override
11  ``EnvRunnerGroup._make_worker``, ``_remote_config``,      runner_group.py ``R3EnvRunnerGroup``: passes remote runners
    ``_remote_config_obj_ref``; ``EnvRunnerGroup`` as a     the config by value; ``Algorithm.setup`` builds the group
    global of ``ray.rllib.algorithms.algorithm``             class it finds under that global (no config field picks it)
12  ``WandbLoggerCallback._logger_actor_cls``,               tracker_callbacks.py ``R3WandbLoggerCallback``: its actor class
    ``_remote_logger_class``, ``_start_logging_actor``,      (a sample table), the actor's options (WANDB_* settings, no
    ``_trial_logging_actors``, ``_trial_queues``,            restarts), the trial's folder as W&B's dir, and results
    ``_signal_logging_actor_stop``;                          queued without waiting; ``R3MLflowLoggerCallback``: batched
    ``_WandbLoggingActor._handle_result``, ``_clean_log``,   params and metrics through MLflow's client, per trial run
    ``_QueueItem``; ``Queue.actor``, ``_QueueActor``'s
    ``put_nowait_batch``;
    ``_force_on_current_node``; ``MLflowLoggerCallback``'s
    ``_trial_runs``, ``_MLflowLoggerUtil._get_client``
13  ``ray.tune.registry._has_rllib_trainable``               r3_rllib/__init__.py ``_answer_for_r3``: wrapped so that Tune
                                                             resolves "R3" without registering (importing) every RLlib
                                                             algorithm; no public hook answers an unknown name
14  ``LearnerGroup._worker_manager``                         learner_calls.py ``collective_results``: an update's calls
    (``foreach_actor_async(func, tag)``,                     fetched as they finish, so one learner's failure is seen
    ``fetch_ready_async_reqs(tags, timeout_seconds)``)       while the others wait in a collective (``foreach_learner``
                                                             waits for all)
15  ``LearnerGroup._backend_executor``                       learner_calls.py ``stop_stuck_learners``: a group whose
    (``BackendExecutor.shutdown(graceful_termination)``)     learners were left in a collective is stopped without the
                                                             graceful teardown that waits 30 s for them
==  =======================================================  ==============================================================
"""

from __future__ import annotations

import inspect
import types

import pytest

pytest.importorskip("ray.rllib")


def _params(fn) -> list[str]:
    """The parameter names of `fn`, without the `_ray_trace_ctx` keyword Ray adds to the methods of a class once it
    has been made an actor in this process (the e2e tests do that to learners before the unit tests run)."""
    return [name for name in inspect.signature(fn).parameters if name != "_ray_trace_ctx"]


def test_env_runner_group_keeps_a_fault_tolerant_manager_that_can_mark_actors_unhealthy():
    # 1. coordinator.py `_restart_hung_runners` and startup.py `runner_startup_error`.
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.utils.actor_manager import FaultTolerantActorManager

    assert "self._worker_manager = FaultTolerantActorManager(" in inspect.getsource(EnvRunnerGroup)
    params = inspect.signature(FaultTolerantActorManager.set_actor_state).parameters
    assert list(params) == ["self", "actor_id", "healthy"]
    assert _params(FaultTolerantActorManager.actors) == ["self"]


def test_torch_learner_wraps_modules_through_an_overridable_ddp_hook():
    # 2. learner.py `_make_modules_ddp_if_necessary`.
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

    from r3_rllib.algorithms.r3.learner import R3Learner

    assert "self._make_modules_ddp_if_necessary()" in inspect.getsource(TorchLearner.build)
    assert _params(TorchLearner._make_modules_ddp_if_necessary) == ["self"]
    assert R3Learner._make_modules_ddp_if_necessary is not TorchLearner._make_modules_ddp_if_necessary


def test_tune_global_registry_resolves_env_creators():
    # 3. runner_setup.py `_text_env_factory`.
    from ray.tune.registry import ENV_CREATOR, _global_registry, register_env

    register_env("r3_private_api_probe", lambda cfg: cfg)
    assert _global_registry.contains(ENV_CREATOR, "r3_private_api_probe")
    assert _global_registry.get(ENV_CREATOR, "r3_private_api_probe")({"x": 1}) == {"x": 1}


def test_algorithm_counts_restored_runners_in_a_defaultdict():
    # 4. r3.py `restore_env_runners` adds to the counter RLlib's own restore adds to.
    from ray.rllib.algorithms.algorithm import Algorithm

    assert "self._counters = defaultdict(int)" in inspect.getsource(Algorithm.__init__)
    assert 'self._counters["total_num_restored_workers"] += len(restored)' in inspect.getsource(
        Algorithm.restore_env_runners
    )


def test_trainable_iteration_reads_the_private_counter():
    # 5. checkpointing.py `load_checkpoint` sets `_iteration`; the public properties must read that attribute.
    from ray.tune.trainable import Trainable

    assert "self._iteration = 0" in inspect.getsource(Trainable.__init__)
    probe = types.SimpleNamespace(_iteration=7)
    assert Trainable.iteration.fget(probe) == 7
    assert Trainable.training_iteration.fget(probe) == 7


def test_learner_build_state_lives_in_the_attributes_r3_learner_sets():
    # 6-9. `R3Learner.build` replaces `Learner.build`: the base class must still keep its state in these attributes.
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

    init = inspect.getsource(Learner.__init__)
    assert "self._is_built = False" in init
    assert "self._device = None" in init
    build = inspect.getsource(Learner.build)
    assert "if self._is_built:" in build
    assert "self._module = self._make_module()" in build
    assert Learner.module.fget(types.SimpleNamespace(_module="m")) == "m"  # `learner.module` reads `_module`
    assert _params(TorchLearner._make_module) == ["self"]
    assert "self._device" in inspect.getsource(TorchLearner.build)


def test_rl_module_forward_methods_call_the_forward_hook():
    # 10. rl_module.py `CausalLMModule._forward`.
    from ray.rllib.core.rl_module.rl_module import RLModule

    assert _params(RLModule._forward) == ["self", "batch", "kwargs"]
    for public in (RLModule._forward_train, RLModule._forward_inference, RLModule._forward_exploration):
        assert "self._forward(batch, **kwargs)" in inspect.getsource(public)


def test_algorithm_setup_builds_the_group_found_under_its_module_global():
    # 11. runner_group.py: `r3_env_runner_group` binds R3EnvRunnerGroup there during `Algorithm.setup`, whose
    # `add_workers` hands `_make_worker` the ObjectRef of `_remote_config` that R3EnvRunnerGroup swaps for the value.
    from ray.rllib.algorithms import algorithm
    from ray.rllib.env.env_runner_group import EnvRunnerGroup

    assert algorithm.EnvRunnerGroup is EnvRunnerGroup
    assert "self.env_runner_group = EnvRunnerGroup(" in inspect.getsource(algorithm.Algorithm.setup)
    init = inspect.getsource(EnvRunnerGroup.__init__)
    assert "self._remote_config = config" in init
    assert "self._remote_config_obj_ref = ray.put(self._remote_config)" in init
    assert "config=self._remote_config_obj_ref," in inspect.getsource(EnvRunnerGroup.add_workers)
    params = inspect.signature(EnvRunnerGroup._make_worker).parameters
    for name in ("config", "worker_index"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_tune_tracker_callbacks_keep_the_hooks_r3_overrides():
    # 12. tracker_callbacks.py.
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from ray.air._internal.mlflow import _MLflowLoggerUtil
    from ray.air.integrations import wandb as ray_wandb
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.air.util.node import _force_on_current_node
    from ray.util.queue import Queue

    callback = ray_wandb.WandbLoggerCallback
    assert callback._logger_actor_cls is ray_wandb._WandbLoggingActor
    init = inspect.getsource(callback.__init__)
    for attribute in ("_remote_logger_class = None", "_trial_logging_actors", "_trial_queues"):
        assert f"self.{attribute}" in init
    start = inspect.getsource(callback._start_logging_actor)
    assert "if not self._remote_logger_class:" in start and "(self._logger_actor_cls)" in start
    assert _params(callback._start_logging_actor) == ["self", "trial", "exclude_results", "wandb_init_kwargs"]
    assert "self._handle_result(item_content)" in inspect.getsource(ray_wandb._WandbLoggingActor.run)
    assert _params(ray_wandb._WandbLoggingActor._handle_result) == ["self", "result"]
    assert "_QueueItem.RESULT" in inspect.getsource(ray_wandb._WandbLoggingActor.run)
    assert _params(ray_wandb._clean_log)[0] == "obj" and callable(_force_on_current_node)
    assert "self.actor = (" in inspect.getsource(Queue.__init__)
    assert "self._signal_logging_actor_stop(trial=trial)" in inspect.getsource(callback.log_trial_end)
    assert _params(callback._signal_logging_actor_stop) == ["self", "trial"]
    from ray.util.queue import _QueueActor

    assert _params(_QueueActor.put_nowait_batch) == ["self", "items"]
    assert "self._trial_runs = {}" in inspect.getsource(MLflowLoggerCallback.setup)
    assert _params(_MLflowLoggerUtil._get_client) == ["self"]


def test_tune_registry_asks_a_module_global_for_unknown_trainables():
    # 13. r3_rllib/__init__.py `_answer_for_r3`: Tune looks the function up as a module global at call time, so the
    # wrapper installed on the module is the one it calls.
    import ray.tune.registry as registry

    import r3_rllib  # noqa: F401  (installs the wrapper once Tune's registry is imported)

    assert _params(registry._has_rllib_trainable) == ["trainable_name"]
    source = inspect.getsource(registry)
    assert (
        source.count("_has_rllib_trainable(") >= 2
    )  # its definition and at least one call by its global name
    assert getattr(registry._has_rllib_trainable, "answers_r3", False)


def test_learner_group_keeps_a_manager_that_calls_learners_asynchronously():
    # 14. learner_calls.py `collective_results`.
    from ray.rllib.core.learner.learner_group import LearnerGroup
    from ray.rllib.utils.actor_manager import FaultTolerantActorManager

    assert "self._worker_manager = FaultTolerantActorManager(" in inspect.getsource(LearnerGroup.__init__)
    assert _params(FaultTolerantActorManager.foreach_actor_async)[:3] == ["self", "func", "tag"]
    params = _params(FaultTolerantActorManager.fetch_ready_async_reqs)
    assert {"tags", "timeout_seconds"} <= set(params)


def test_learner_group_shuts_its_backend_executor_down_with_or_without_the_graceful_teardown():
    # 15. learner_calls.py `stop_stuck_learners`.
    from ray.rllib.core.learner.learner_group import LearnerGroup
    from ray.train._internal.backend_executor import BackendExecutor

    source = inspect.getsource(LearnerGroup.__init__)
    assert "BackendExecutor(" in source and "self._backend_executor = backend_executor" in source
    assert "self._backend_executor.shutdown(" in inspect.getsource(LearnerGroup.shutdown)
    assert _params(BackendExecutor.shutdown) == ["self", "graceful_termination"]
