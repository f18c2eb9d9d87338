"""`LLMEnvRunner`: an RLlib EnvRunner that holds a generation engine and turns TextEnv queries into groups.

One `sample()` call hands the runner's env, engine and settings (a `RolloutContext`) to the runner's rollout kind
(`r3_rllib.rollout.kinds`: single-step, multi-step or tool use, chosen once from the env when the runner is built),
which takes the next queries, adds R^3 reflection prompts for hard queries (the replay actor's history, asked
through the runner), generates and scores them; the runner returns a `RolloutResult` (rollout_types.py): `Group`s
carrying token ids, behaviour log-probs and entropies, with the runner's data epoch, timings, totals and state. How
the env is built and sharded is in runner_setup.py.
"""

from __future__ import annotations

# First: the heavy imports with the collector off, then frozen (frozen_imports.py: 0.84x an actor's import CPU).
from r3_rllib.algorithms.r3 import frozen_imports  # noqa: F401

# isort: split

import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Collection

import ray
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable

from r3_rllib.algorithms.r3.partial_rollout import NewerWeightsPuller
from r3_rllib.algorithms.r3.rollout_types import RolloutResult, RolloutTimings, RunnerState
from r3_rllib.algorithms.r3.runner_eval import HeldOutEvaluation
from r3_rllib.algorithms.r3.runner_setup import (
    build_env,
    env_accepts_shard,
    load_policy_tokenizer,
    model_context,
    runner_env_config,
    runner_seed,
    start_gateway,
)
from r3_rllib.algorithms.r3.weight_sync import LoraAdapterWeights, named_tensors, unpack_weights
from r3_rllib.config.settings import default_values
from r3_rllib.core.method import method_for
from r3_rllib.core.reflection import ReflectionSettings
from r3_rllib.core.threads import phase_start_threads
from r3_rllib.engines import build_engine
from r3_rllib.engines.base import SamplingParams, set_torch_threads
from r3_rllib.envs.base import TextEnv, supports_agent_runs
from r3_rllib.models.hub import policy_path
from r3_rllib.rollout.kinds import kind_for_env
from r3_rllib.rollout.kinds.context import RolloutContext, hard_wrong_answers
from r3_rllib.types.samples import Sample

logger = logging.getLogger(__name__)


class LLMEnvRunner(HeldOutEvaluation, EnvRunner, Checkpointable):
    """Samples groups of responses from a TextEnv with a GenerationEngine (see module docstring); evaluates held-out
    queries (runner_eval.py)."""

    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        # Torch threads (cpu_threads, core/threads.py): the reservation while idle, up to the plan while sampling.
        # The engine is built at the plan, the count it generates at while the synchronous loop's learners wait.
        self._threads = (self.config.phase_threads().runner, self.config.reserved_threads().runner)
        set_torch_threads(self._threads[0])
        self.tokenizer = load_policy_tokenizer(self.config)
        seed = runner_seed(self.config, self.worker_index)
        shardable = env_accepts_shard(self.config.env)
        self.env = build_env(
            self.config.env,
            runner_env_config(self.config, self.worker_index, shardable=shardable),
            self.tokenizer,
        )
        self._eval_env: TextEnv | None = None
        # The bound a generated reflection prompt is held to (it adds a past answer and guidance to a prompt).
        self._model_context = model_context(self.config)
        # Decided once, here: a multi-step env (episode(query_id)) is rolled out and evaluated as trajectories of
        # step samples, a tool env (tool_episode(query_id)) as multi-turn trajectories of one sample each, a
        # single-step one as G responses per prompt (rollout/kinds/). Settings that do not fit it are refused before
        # the engine loads.
        self.kind = kind_for_env(self.env)
        self.kind.check_config(self.config, default_values())
        # What the training method needs from every step()'s info (checked as the rollout scores).
        self._check_info = functools.partial(method_for(self.config).check_step_info, self.config)
        # LoRA runs build an engine ready for adapters (the learner then sends adapters only, see update_weights).
        lora_rank = int(getattr(self.config, "lora_rank", 0) or 0)
        options = dataclasses.replace(self.config.engine_options(), lora_rank=lora_rank)
        # The serving budget: vLLM's max_model_len unless engine_kwargs set it.
        budget = self.config.serving_budget(self.tokenizer)
        self.engine = build_engine(
            options, self.tokenizer, model_path=policy_path(options.model_path), budget=budget
        )
        self.engine.set_threads(self._threads[1])
        self._sample_seed = seed
        # This process's id: a process Ray restarted before RLlib noticed answers with another (coordinator.py).
        self.incarnation = uuid.uuid4().hex
        self._last_call_end: float | None = None  # when the last rollout or weight load ended (idle time)
        self._replay = None  # replay actor handle, set by the algorithm when reflection is on
        self._context: RolloutContext | None = None  # the current (or last) rollout's
        self._stop_ids = tuple(i for i in [self.tokenizer.eos_token_id] if i is not None)
        self._gateway = None  # an agent env's rollout gateway, started on first use (_rollout_gateway)

    # -- RLlib EnvRunner API ------------------------------------------------------------------------------------
    @override(EnvRunner)
    def assert_healthy(self):
        assert self.engine is not None and self.env is not None

    @override(EnvRunner)
    def get_spaces(self):
        spaces = (self.env.observation_space, self.env.action_space)
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    @override(EnvRunner)
    def get_metrics(self) -> dict:
        return {}

    @override(EnvRunner)
    def stop(self):
        if getattr(self, "_gateway", None) is not None:
            self._gateway.stop()
            self._gateway = None
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown()
            self.engine = None

    # -- the work -----------------------------------------------------------------------------------------------
    def set_replay_actor(self, client) -> None:
        """Give the runner the replay buffer (a ReplayBufferClient) for reflection prompts."""
        self._replay = client

    def sampling_params(self, *, greedy: bool = False, seed: int | None = None) -> SamplingParams:
        """The config's sampling settings (greedy: temperature 0); `seed` None: the next seed of the training
        sampler."""
        if seed is None:
            self._sample_seed += 1
            seed = self._sample_seed
        c = self.config
        return SamplingParams(
            max_new_tokens=c.max_new_tokens,
            temperature=0.0 if greedy else c.temperature,
            top_p=1.0 if greedy else c.top_p,
            top_k=-1 if greedy else c.top_k,
            stop_token_ids=self._stop_ids,
            seed=seed,
        )

    @contextlib.contextmanager
    def phase_threads(self):
        """The engine's threads for one rollout or held-out evaluation: the cores free now, up to this runner's plan;
        then back to its reservation, so the learners take the free cores while this runner waits."""
        self.engine.set_threads(phase_start_threads(*self._threads))
        try:
            yield
        finally:
            self.engine.set_threads(self._threads[1])

    @override(EnvRunner)
    def sample(
        self, *, num_queries: int = 1, reflection: ReflectionSettings | None = None, **kwargs
    ) -> RolloutResult:
        """Sample `num_queries` fresh groups (plus reflection groups when `reflection` is given). A non-finite
        reward raises NonFiniteRewardError naming its query where the env gives it (it would make the batch's
        advantages NaN)."""
        t0, self._context = time.perf_counter(), None
        idle_s = t0 - self._last_call_end if self._last_call_end is not None else 0.0
        with self.phase_threads():
            if self.config.sleep_between_rollouts:
                self.engine.wake_up()
            self._context = self.rollout_context()
            groups, timings, tokens, totals = self.kind.sample(self._context, num_queries, reflection)
        if self._context.reflection_dropped:
            totals = {**totals, "reflection_dropped_too_long": float(self._context.reflection_dropped)}
        self._last_call_end = time.perf_counter()
        return RolloutResult(
            worker_id=int(self.worker_index or 0),
            groups=tuple(groups),
            env_epoch=int(getattr(self.env, "epoch", 0)),
            timings=RolloutTimings(*timings, sample_s=self._last_call_end - t0, idle_s=idle_s),
            generated_tokens=int(tokens),
            # This rollout's statistics as sums, merged over runners by the algorithm.
            totals=totals,
            # Where this runner stands in its data after these draws: a restarted runner resumes from here.
            runner_state=self.runner_state(),
            incarnation=self.incarnation,
        )

    @property
    def query_id(self) -> str | None:
        """The query the current rollout is grading (None before one): a RunnerError names it (runner_faults.py)."""
        return self._context.query_id if self._context is not None else None

    def rollout_context(self) -> RolloutContext:
        """What the rollout kind needs of this runner for one call: env, engine, tokenizer, settings, the training
        sampler, the replay actor's past wrong answers (reflection) and the check of ``step()``'s info."""
        return RolloutContext(
            env=self.env,
            engine=self.engine,
            tokenizer=self.tokenizer,
            config=self.config,
            sampling_params=self.sampling_params,
            past_wrong_answers=self._past_wrong_answers if self._replay is not None else None,
            check_info=self._check_info,
            model_context=self._model_context,
            gateway=self._rollout_gateway(),
        )

    def _rollout_gateway(self):
        """The rollout gateway agent programs call (an agent env's runner only: None otherwise), started on first
        use; each rollout sets its sampling defaults (the rollout kind does)."""
        if self._gateway is None and supports_agent_runs(self.env):
            # The training sampler's own seed: starting the gateway draws no seed of its sequence.
            defaults = self.sampling_params(seed=self._sample_seed)
            self._gateway = start_gateway(self.config, self.engine, self.tokenizer, defaults)
        return self._gateway

    def _past_wrong_answers(
        self, query_ids: list[str], settings: ReflectionSettings
    ) -> list[tuple[str, Sample | None]]:
        """The hard queries' past wrong answers from the replay actor (``hard_wrong_answers``). A replay actor that
        died (Ray restarts it, empty, and the algorithm refills it) costs this rollout its reflection prompts, not
        the rollout."""
        try:
            return hard_wrong_answers(self._replay, query_ids, settings)
        except ray.exceptions.RayActorError as err:
            logger.warning("replay actor unavailable, no reflection prompts in this rollout: %s", err)
            return []

    # -- weights ------------------------------------------------------------------------------------------------
    def set_weight_board(self, board) -> None:  # partial rollouts: newer weights between decoding steps
        self.engine.set_between_steps(
            NewerWeightsPuller(board, self.update_weights, lambda: self.engine.version)
        )

    def update_weights(self, weights_ref, version: int, only_if_newer: bool = False) -> float:
        """Load weights (ObjectRef of / `PackedWeights`, dict of tensors, or `LoraAdapterWeights` on the base) into
        the engine; seconds taken. ``only_if_newer``: skip a version the engine has (pulled mid-rollout)."""
        t0 = time.perf_counter()
        if only_if_newer and version <= self.engine.version:
            return 0.0
        weights = ray.get(weights_ref) if isinstance(weights_ref, ray.ObjectRef) else weights_ref
        if self.config.sleep_between_rollouts:
            self.engine.wake_up()
        if isinstance(weights, LoraAdapterWeights):
            self.engine.update_adapter(
                unpack_weights(weights.weights),
                rank=weights.rank,
                alpha=weights.alpha,
                target_modules=weights.target_modules,
                version=version,
            )
        else:
            self.engine.update_weights(named_tensors(weights), version)
        if self.config.sleep_between_rollouts:
            self.engine.sleep()
        self._last_call_end = time.perf_counter()
        return self._last_call_end - t0

    # -- Checkpointable -----------------------------------------------------------------------------------------
    @override(Checkpointable)
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs,
    ) -> dict:
        # Weights live in the learner's checkpoint; a runner's state is its position in the data and its sampling
        # seed (RunnerState, as the versioned dict RLlib's Checkpointable API passes around).
        return self.runner_state().to_dict()

    def runner_state(self) -> RunnerState:
        """Where this runner stands in its data, and its sampling seed."""
        return RunnerState(env=self.env.state(), sample_seed=self._sample_seed)

    @override(Checkpointable)
    def set_state(self, state: dict) -> None:
        if not state or COMPONENT_RL_MODULE in state and len(state) <= 2:
            return  # RLlib's post-setup weight broadcast: our weights arrive through update_weights().
        if "env" in state:
            restored = RunnerState.from_dict(state, source=f"EnvRunner {self.worker_index} state")
            self.env.set_state(restored.env)
            self._sample_seed = restored.sample_seed

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config, "worker_index": self.worker_index, "num_workers": self.num_workers}

    @override(Checkpointable)
    def get_checkpointable_components(self):
        return []
