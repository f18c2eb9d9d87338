"""RLlib's inherited settings, classified: the ones an R3 run reads, and the ones it ignores (pure; no Ray).

`R3Config` is an RLlib ``AlgorithmConfig``, so every RLlib builder method accepts every RLlib setting. R3 replaces
RLlib's sampling, batching, loss and evaluation with its own, so most of those settings would be accepted and change
nothing (``train_batch_size=4096`` trained on ``queries_per_iteration x group_size`` samples all the same). Each
RLlib setting is declared here once: in :data:`USED_RLLIB_FIELDS` (with what reads it) or in
:data:`IGNORED_RLLIB_FIELDS` (with the R3 setting to use instead); RLlib's deprecated settings (their default is
RLlib's ``DEPRECATED_VALUE``, -1) are ignored as a class. :func:`ignored_field_errors` names every ignored setting
a config changes from its default; ``R3Config.validate`` refuses them (so ``build_algo`` and ``r3 train`` do).
``tests/unit/algorithms/test_rllib_fields.py`` fails when an RLlib upgrade brings a setting declared in neither table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: RLlib's marker of a deprecated setting (``ray._common.deprecation.DEPRECATED_VALUE``; kept here so this module
#: imports no Ray).
DEPRECATED_VALUE = -1

_RUNNER = "an R3 EnvRunner samples groups from its TextEnv with its engine"
_ONLINE = "R3 samples online from its TextEnv; offline data is not read"
_ONE_MODULE = "R3 trains one causal LM (one RLModule); multi-agent settings do not apply"
_EVAL = "held-out evaluation: eval_interval, eval_num_queries, eval_env_config"
_TF = "R3 runs on torch only"
_LEARNER = "R3Learner builds its own optimizer and update (learner.py)"
_CONNECTORS = "R3 moves samples without RLlib connectors (RolloutResult -> TrainingBatch)"
_EPISODE_CALLBACKS = "R3's runners call no episode callbacks; read the rollout/ metrics of each result"

#: RLlib settings an R3 run ignores, each with what to set instead. A value other than the default is refused.
IGNORED_RLLIB_FIELDS: dict[str, str] = {
    # -- batch and optimisation -------------------------------------------------------------------------------------
    "train_batch_size": "queries_per_iteration x group_size (samples per iteration)",
    "_train_batch_size_per_learner": "queries_per_iteration x group_size (split over the learners)",
    "minibatch_size": "num_minibatches (and micro_batch_size / micro_batch_max_tokens for memory)",
    "shuffle_batch_per_epoch": "nothing: the minibatch split is drawn from debugging(seed=...)",
    "gamma": "nothing: rewards are outcome rewards; multi-step envs discount with step_gamma",
    "grad_clip_by": "grad_clip (always by global norm)",
    "optimizer": "lr, weight_decay, grad_clip",
    "learner_config_dict": "the R3 settings themselves (.training(...) / .r3(...))",
    "log_gradients": _LEARNER,
    "torch_skip_nan_gradients": _LEARNER,
    "torch_ddp_kwargs": "fsdp (FSDP2 sharding) or fsdp=False (replicated learners averaging gradients)",
    "torch_compile_learner": _LEARNER,
    "torch_compile_learner_dynamo_backend": _LEARNER,
    "torch_compile_learner_dynamo_mode": _LEARNER,
    "torch_compile_learner_what_to_compile": _LEARNER,
    "_torch_grad_scaler_class": _LEARNER + "; precision is dtype",
    "_torch_lr_scheduler_classes": _LEARNER + "; the learning rate is lr",
    "num_aggregator_actors_per_learner": "nothing: the driver builds the batch (groups.py)",
    "max_requests_in_flight_per_aggregator_actor": "nothing: the driver builds the batch (groups.py)",
    "model": "model_path, attn_implementation (RLlib's old-stack model dict)",
    "_model_config": "model_path, attn_implementation, rollout_head* (the module's config is built from them)",
    # -- sampling -----------------------------------------------------------------------------------------------------
    "sample_timeout_s": "rollout_timeout_s",
    "rollout_fragment_length": "max_new_tokens (a response's length) and queries_per_iteration",
    "batch_mode": "nothing: " + _RUNNER,
    "num_envs_per_env_runner": "queries_per_iteration (a runner serves its share of them)",
    "gym_env_vectorize_mode": "nothing: " + _RUNNER,
    "remote_worker_envs": "nothing: " + _RUNNER,
    "remote_env_batch_wait_ms": "nothing: " + _RUNNER,
    "explore": "temperature, top_p, top_k",
    "exploration_config": "temperature, top_p, top_k",
    "episode_lookback_horizon": "nothing: " + _RUNNER,
    "episodes_to_numpy": "nothing: " + _RUNNER,
    "clip_rewards": "the env's reward (and overlong_shaping for length penalties)",
    "normalize_actions": "nothing: actions are text",
    "clip_actions": "nothing: actions are text",
    "action_mask_key": "nothing: actions are text",
    "observation_space": "nothing: the TextEnv's spaces are text",
    "action_space": "nothing: the TextEnv's spaces are text",
    "observation_filter": "nothing: observations are text",
    "update_worker_filter_stats": "nothing: observations are text",
    "use_worker_filter_stats": "nothing: observations are text",
    "sync_filters_on_rollout_workers_timeout_s": "nothing: observations are text",
    "compress_observations": "nothing: observations are text",
    "preprocessor_pref": "nothing: observations are text",
    "disable_env_checking": "nothing: the TextEnv is checked when the runner builds it",
    "render_env": "nothing: " + _RUNNER,
    "ignore_final_observation": "nothing: " + _RUNNER,
    "restart_failed_sub_environments": "restart_failed_env_runners (a failed runner is restarted whole)",
    "create_env_on_local_worker": "num_env_runners (R3 samples on remote runners only)",
    "sampler_perf_stats_ema_coef": "nothing: " + _RUNNER,
    "fake_sampler": "nothing: " + _RUNNER,
    "replay_sequence_length": "replay_k and the replay_* settings (R^3's replay buffer)",
    "sample_collector": "nothing: " + _RUNNER,
    "_disable_action_flattening": "nothing: actions are text",
    "_disable_preprocessor_api": "nothing: observations are text",
    "_disable_initialize_loss_from_dummy_batch": "nothing: " + _LEARNER,
    "_env_to_module_connector": _CONNECTORS,
    "_module_to_env_connector": _CONNECTORS,
    "_learner_connector": _CONNECTORS,
    "add_default_connectors_to_env_to_module_pipeline": _CONNECTORS,
    "add_default_connectors_to_module_to_env_pipeline": _CONNECTORS,
    "add_default_connectors_to_learner_pipeline": _CONNECTORS,
    "callbacks_on_environment_created": _EPISODE_CALLBACKS,
    "callbacks_on_episode_created": _EPISODE_CALLBACKS,
    "callbacks_on_episode_start": _EPISODE_CALLBACKS,
    "callbacks_on_episode_step": _EPISODE_CALLBACKS,
    "callbacks_on_episode_end": _EPISODE_CALLBACKS,
    "callbacks_on_sample_end": _EPISODE_CALLBACKS,
    "metrics_num_episodes_for_smoothing": _EPISODE_CALLBACKS,
    "metrics_episode_collection_timeout_s": _EPISODE_CALLBACKS,
    "keep_per_episode_custom_metrics": _EPISODE_CALLBACKS,
    "min_sample_timesteps_per_iteration": "queries_per_iteration (or min_time_s_per_iteration); RLlib counts "
    "env steps R3 does not report, so the iteration would never end",
    "min_train_timesteps_per_iteration": "queries_per_iteration (or min_time_s_per_iteration); RLlib counts "
    "trained steps R3 does not report, so the iteration would never end",
    "count_steps_by": "nothing: R3 counts queries and samples (rollout/ metrics)",
    "extra_python_environs_for_driver": "ray.init(runtime_env={'env_vars': ...}) (RLlib's old stack only)",
    "extra_python_environs_for_worker": "ray.init(runtime_env={'env_vars': ...}) (RLlib's old stack only)",
    "export_native_model_files": "algo.export_policy(folder) (a Hugging Face folder)",
    "checkpoint_trainable_policies_only": "nothing: R3 checkpoints its one policy",
    # -- API stack and frameworks -------------------------------------------------------------------------------------
    "framework_str": _TF,
    "eager_tracing": _TF,
    "eager_max_retraces": _TF,
    "tf_session_args": _TF,
    "local_tf_session_args": _TF,
    "enable_tf1_exec_eagerly": _TF,
    "torch_compile_worker": "nothing: the runners' engine is HF or vLLM (engine, engine_kwargs)",
    "torch_compile_worker_dynamo_backend": "nothing: the runners' engine is HF or vLLM (engine, engine_kwargs)",
    "torch_compile_worker_dynamo_mode": "nothing: the runners' engine is HF or vLLM (engine, engine_kwargs)",
    "enable_rl_module_and_learner": "nothing: R3 runs on RLlib's new API stack only",
    "enable_env_runner_and_connector_v2": "nothing: R3 runs on RLlib's new API stack only",
    "_tf_policy_handles_more_than_one_loss": _TF,
    "_prior_exploration_config": "temperature, top_p, top_k",
    "num_gpus": "num_gpus_per_learner, num_gpus_per_env_runner (RLlib's old stack only)",
    "_fake_gpus": "nothing: RLlib's old stack only",
    "local_gpu_idx": "num_gpus_per_learner (RLlib's old stack only)",
    # -- multi-agent ------------------------------------------------------------------------------------------------
    "policies": _ONE_MODULE,
    "policy_mapping_fn": _ONE_MODULE,
    "policies_to_train": _ONE_MODULE,
    "policy_map_capacity": _ONE_MODULE,
    "policy_states_are_swappable": _ONE_MODULE,
    "observation_fn": _ONE_MODULE,
    "algorithm_config_overrides_per_module": _ONE_MODULE,
    "_per_module_overrides": _ONE_MODULE,
    "use_env_runner_state_server": "nothing: R3's runners keep no connector state to share",
    "env_runner_state_server_max_concurrency": "nothing: R3's runners keep no connector state to share",
    # -- RLlib's evaluation ---------------------------------------------------------------------------------------
    "evaluation_interval": _EVAL,
    "evaluation_duration": _EVAL,
    "evaluation_duration_unit": _EVAL,
    "evaluation_num_env_runners": _EVAL,
    "evaluation_parallel_to_training": _EVAL,
    "evaluation_config": _EVAL,
    "evaluation_sample_timeout_s": _EVAL,
    "evaluation_auto_duration_min_env_steps_per_sample": _EVAL,
    "evaluation_auto_duration_max_env_steps_per_sample": _EVAL,
    "evaluation_force_reset_envs_before_iteration": _EVAL,
    "evaluation_error_after_n_consecutive_skips": _EVAL,
    "evaluation_unhealthy_workers_timeout_s": _EVAL,
    "custom_evaluation_function": _EVAL,
    "callbacks_on_evaluate_start": _EVAL,
    "callbacks_on_evaluate_end": _EVAL,
    "off_policy_estimation_methods": _EVAL,
    "ope_split_batch_by_episode": _EVAL,
    # -- offline data -----------------------------------------------------------------------------------------------
    **{
        name: _ONLINE
        for name in (
            "input_",
            "input_config",
            "input_compress_columns",
            "input_filesystem",
            "input_filesystem_kwargs",
            "input_read_batch_size",
            "input_read_episodes",
            "input_read_method",
            "input_read_method_kwargs",
            "input_read_sample_batches",
            "input_read_schema",
            "input_spaces_jsonable",
            "actions_in_input_normalized",
            "postprocess_inputs",
            "shuffle_buffer_size",
            "output",
            "output_config",
            "output_compress_columns",
            "output_filesystem",
            "output_filesystem_kwargs",
            "output_max_file_size",
            "output_max_rows_per_file",
            "output_write_episodes",
            "output_write_method",
            "output_write_method_kwargs",
            "output_write_remaining_data",
            "offline_sampling",
            "offline_data_class",
            "offline_loss_for_module_fn",
            "prelearner_class",
            "prelearner_buffer_class",
            "prelearner_buffer_kwargs",
            "prelearner_module_synch_period",
            "prelearner_use_recorded_module_states",
            "dataset_num_iters_per_learner",
            "dataset_num_iters_per_eval_runner",
            "iter_batches_kwargs",
            "map_batches_kwargs",
            "materialize_data",
            "materialize_mapped_data",
            "num_offline_eval_runners",
            "offline_evaluation_interval",
            "offline_evaluation_duration",
            "offline_evaluation_type",
            "offline_evaluation_timeout_s",
            "offline_evaluation_parallel_to_training",
            "offline_eval_batch_size_per_runner",
            "offline_eval_rl_module_inference_only",
            "offline_eval_runner_class",
            "offline_eval_runner_health_probe_timeout_s",
            "offline_eval_runner_restore_timeout_s",
            "num_cpus_per_offline_eval_runner",
            "num_gpus_per_offline_eval_runner",
            "custom_resources_per_offline_eval_runner",
            "max_requests_in_flight_per_offline_eval_runner",
            "max_num_offline_eval_runner_restarts",
            "restart_failed_offline_eval_runners",
            "ignore_offline_eval_runner_failures",
            "validate_offline_eval_runners_after_construction",
            "broadcast_offline_eval_runner_states",
            "callbacks_on_evaluate_offline_start",
            "callbacks_on_evaluate_offline_end",
            "callbacks_on_offline_eval_runners_recreated",
        )
    },
}

#: RLlib settings an R3 run reads, each with what reads it (R3's code or the RLlib machinery R3 runs: the
#: Algorithm's iteration loop, EnvRunnerGroup, LearnerGroup, checkpoints, callbacks).
USED_RLLIB_FIELDS: dict[str, str] = {
    "env": "the TextEnv (runner_setup.py)",
    "env_config": "the TextEnv's keyword arguments (runner_setup.py)",
    "seed": "data order, sampling, minibatch split, replay draws (debugging(seed=...))",
    "lr": "R3Learner's AdamW",
    "grad_clip": "R3Learner's global-norm clip",
    "num_epochs": "R3Learner's passes over each batch",
    "algo_class": "the algorithm class (config.py)",
    "env_runner_cls": "the runner class (config.py)",
    "_learner_class": "the learner class (RLlib's get_learner_class; default R3Learner)",
    "_rl_module_spec": "RLlib merges it over get_default_rl_module_spec (the module the learner builds)",
    "num_env_runners": "EnvRunnerGroup: the runner actors",
    "create_local_env_runner": "EnvRunnerGroup (R3 sets False: no engine in the driver)",
    "num_cpus_per_env_runner": "EnvRunnerGroup: the runners' resources",
    "num_gpus_per_env_runner": "EnvRunnerGroup: the runners' resources",
    "custom_resources_per_env_runner": "EnvRunnerGroup: the runners' resources",
    "placement_strategy": "the Algorithm's placement group",
    "num_cpus_for_main_process": "the Algorithm's placement group (the driver)",
    "custom_resources_for_main_process": "the Algorithm's placement group (the driver)",
    "max_requests_in_flight_per_env_runner": "EnvRunnerGroup's async requests (streaming.py)",
    "merge_env_runner_states": "the Algorithm's runner-state sync (R3 sets False)",
    "broadcast_env_runner_states": "the Algorithm's runner-state sync (R3 sets False)",
    "_dont_auto_sync_env_runner_states": "the Algorithm's runner-state sync",
    "restart_failed_env_runners": "runner fault tolerance (runner_faults.py, EnvRunnerGroup)",
    "max_num_env_runner_restarts": "runner fault tolerance (the runner actors' max_restarts)",
    "delay_between_env_runner_restarts_s": "runner fault tolerance (FaultTolerantActorManager)",
    "env_runner_health_probe_timeout_s": "runner fault tolerance (EnvRunnerGroup's health probe)",
    "env_runner_restore_timeout_s": "runner fault tolerance (runner_faults.py)",
    "num_consecutive_env_runner_failures_tolerance": "runner fault tolerance (the Algorithm)",
    "ignore_env_runner_failures": "runner fault tolerance (EnvRunnerGroup)",
    "validate_env_runners_after_construction": "EnvRunnerGroup's start-up check",
    "num_learners": "LearnerGroup: learner actors (0: in the driver)",
    "num_cpus_per_learner": "LearnerGroup's resources; R3Learner's torch threads",
    "num_gpus_per_learner": "LearnerGroup's resources; R3Learner's device",
    "custom_resources_per_learner": "LearnerGroup's resources",
    "max_requests_in_flight_per_learner": "LearnerGroup's async requests",
    "min_time_s_per_iteration": "the Algorithm repeats training_step within one iteration until this long",
    "callbacks_class": "the Algorithm's callbacks (on_algorithm_init, on_train_result, ...)",
    "callbacks_on_algorithm_init": "the Algorithm's callbacks",
    "callbacks_on_train_result": "the Algorithm's callbacks",
    "callbacks_on_checkpoint_loaded": "the Algorithm's callbacks",
    "callbacks_on_env_runners_recreated": "the Algorithm's callbacks (runner restarts)",
    "log_level": "the Algorithm's logger level",
    "log_sys_usage": "Tune's Trainable (system usage in results)",
    "stats_cls_lookup": "RLlib's MetricsLogger (R3 logs through it)",
    "_use_msgpack_checkpoints": "the Algorithm's checkpoint format",
    # RLlib's own state, set by RLlib (not a user setting).
    "_is_frozen": "RLlib: the config is frozen once the Algorithm holds it",
    "_validate_config": "RLlib: whether validate() runs RLlib's checks (R3's run first regardless)",
    "_is_online": "RLlib: whether the config samples online (True for R3)",
    "_is_atari": "RLlib: cached is_atari of the env (RLlib sets it when read)",
    "in_evaluation": "RLlib: marks an evaluation copy of the config",
    "simple_optimizer": "RLlib: deprecated, but RLlib's validate() sets it (from -1 to a bool) itself",
}


def rllib_field_defaults(defaults: Mapping[str, Any], names: Any = None) -> dict[str, Any]:
    """The default value of each ignored setting in ``defaults`` (a fresh config's attributes), for
    :func:`ignored_field_errors`; ``names`` limits them (default: :data:`IGNORED_RLLIB_FIELDS` and every setting
    whose default is RLlib's deprecated marker)."""
    wanted = set(IGNORED_RLLIB_FIELDS if names is None else names)
    return {
        name: value
        for name, value in defaults.items()
        if name in wanted
        or (names is None and _is_deprecated_marker(value) and name not in USED_RLLIB_FIELDS)
    }


def ignored_field_errors(config: Any, defaults: Mapping[str, Any]) -> list[str]:
    """One message per RLlib setting of ``config`` that R3 ignores and whose value differs from its default in
    ``defaults`` (see :func:`rllib_field_defaults`), naming what to set instead."""
    errors = []
    for name, default in defaults.items():
        value = getattr(config, name, default)
        if _same(_comparable(name, value), _comparable(name, default)):
            continue
        instead = IGNORED_RLLIB_FIELDS.get(name, "nothing: a deprecated RLlib setting that nothing reads")
        errors.append(
            f"RLlib's {name}={value!r} has no effect on an R3 run: leave it at its default ({default!r}); "
            f"instead: {instead}"
        )
    return errors


def _is_deprecated_marker(value: Any) -> bool:
    # bool is an int: False == 0, never -1, but True/False must not count as the marker either way.
    return type(value) is int and value == DEPRECATED_VALUE


def _comparable(name: str, value: Any) -> Any:
    """What of a setting's value counts: for ``policies`` its names (RLlib turns each PolicySpec into a tuple
    when it copies a config's state, so only a renamed or added policy is a change)."""
    if name == "policies" and isinstance(value, Mapping):
        return sorted(value)
    return value


def _same(value: Any, default: Any) -> bool:
    """Equality that survives values whose ``==`` is not a bool (arrays) or raises (treated as changed)."""
    if value is default:
        return True
    try:
        return bool(value == default)
    except Exception:  # a value whose comparison fails is not the default
        return False
