"""`LLMEnvRunner`: an RLlib EnvRunner that holds a generation engine and turns TextEnv queries into groups.

One `sample()` call: take the next queries from the runner's TextEnv, add R^3 reflection prompts for hard queries
(asking the replay actor for their history), generate G responses per prompt in one engine call, score every
response with the env, and return a `RolloutResult` (rollout_types.py): `Group`s carrying token ids, behaviour
log-probs and entropies, with the runner's data epoch, timings, totals and state. A multi-step env is rolled out as
trajectories of step samples instead; which of the two is decided once, when the runner is built. How the env is
built and sharded is in runner_setup.py.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import time
import uuid
from collections import Counter
from collections.abc import Collection

import numpy as np
import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable

from r3_rllib.algorithms.r3.groups import rollout_totals
from r3_rllib.algorithms.r3.multistep import step_groups
from r3_rllib.algorithms.r3.partial_rollout import NewerWeightsPuller, oldest_version
from r3_rllib.algorithms.r3.rollout_types import RolloutResult, RolloutTimings, RunnerState
from r3_rllib.algorithms.r3.runner_eval import HeldOutEvaluation
from r3_rllib.algorithms.r3.runner_faults import check_finite_reward, check_finite_rewards
from r3_rllib.algorithms.r3.runner_setup import (
    build_env,
    check_estimator_fits_env,
    check_tool_settings_fit_env,
    env_accepts_shard,
    load_policy_tokenizer,
    model_context,
    runner_env_config,
    runner_seed,
)
from r3_rllib.algorithms.r3.tool_rollout import trajectory_groups
from r3_rllib.algorithms.r3.weight_sync import LoraAdapterWeights, named_tensors, unpack_weights
from r3_rllib.core.reflection import ReflectionSettings, past_score, select_reflection_queries
from r3_rllib.engines import build_engine
from r3_rllib.engines.base import SamplingParams
from r3_rllib.envs.base import TextEnv
from r3_rllib.envs.context import drop_long_prompts
from r3_rllib.models.hub import policy_path
from r3_rllib.rollout.multistep import episode_totals, rollout_multistep, supports_episodes
from r3_rllib.rollout.tool_use import rollout_tool_use, supports_tool_episodes, tool_use_totals
from r3_rllib.types.samples import Group, Sample

logger = logging.getLogger(__name__)


class LLMEnvRunner(HeldOutEvaluation, EnvRunner, Checkpointable):
    """Samples groups of responses from a TextEnv with a GenerationEngine (see module docstring); evaluates held-out
    queries (runner_eval.py)."""

    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        torch.set_num_threads(max(1, int(self.config.num_cpus_per_env_runner or 1)))
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
        self._reflection_dropped = 0
        # Decided once, here: a multi-step env (episode(query_id)) is rolled out and evaluated as trajectories of
        # step samples (multistep.py), a tool env (tool_episode(query_id)) as multi-turn trajectories of one sample
        # each (tool_use.py), a single-step one as G responses per prompt.
        self.tool_use = supports_tool_episodes(self.env)
        self.multistep = supports_episodes(self.env) and not self.tool_use
        check_estimator_fits_env(self.config, self.multistep)
        check_tool_settings_fit_env(self.config, self.tool_use)
        self._rollout, self._evaluate_part = (
            (self._sample_tool_episodes, self._evaluate_tool_episodes)
            if self.tool_use
            else (self._sample_episodes, self._evaluate_episodes)
            if self.multistep
            else (self._sample_responses, self._evaluate_responses)
        )
        # LoRA runs build an engine ready for adapters (the learner then sends adapters only, see update_weights).
        lora_rank = int(getattr(self.config, "lora_rank", 0) or 0)
        options = dataclasses.replace(self.config.engine_options(), lora_rank=lora_rank)
        self.engine = build_engine(
            options,
            self.tokenizer,
            model_path=policy_path(options.model_path),
            budget=self.config.serving_budget(
                self.tokenizer
            ),  # vLLM's max_model_len unless engine_kwargs set it
        )
        self._sample_seed = seed
        # This process's id: a process Ray restarted before RLlib noticed answers with another (coordinator.py).
        self.incarnation = uuid.uuid4().hex
        self._last_call_end: float | None = None  # when the last rollout or weight load ended (idle time)
        self._replay = None  # replay actor handle, set by the algorithm when reflection is on
        self.query_id: str | None = None  # the query being graded: a RunnerError names it (runner_faults.py)
        self._stop_ids = tuple(i for i in [self.tokenizer.eos_token_id] if i is not None)

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

    @override(EnvRunner)
    def sample(
        self, *, num_queries: int = 1, reflection: ReflectionSettings | None = None, **kwargs
    ) -> RolloutResult:
        """Sample `num_queries` fresh groups (plus reflection groups when `reflection` is given). A non-finite
        reward raises NonFiniteRewardError naming its query where the env gives it (it would make the batch's
        advantages NaN)."""
        t0, self.query_id = time.perf_counter(), None
        idle_s = t0 - self._last_call_end if self._last_call_end is not None else 0.0
        if self.config.sleep_between_rollouts:
            self.engine.wake_up()
        self._reflection_dropped = 0
        groups, timings, tokens, totals = self._rollout(num_queries, reflection)
        if self._reflection_dropped:
            totals = {**totals, "reflection_dropped_too_long": float(self._reflection_dropped)}
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

    def _sample_responses(
        self, num_queries: int, reflection: ReflectionSettings | None
    ) -> tuple[list[Group], tuple[float, float], int, dict[str, float]]:
        """Single-step rollout: G responses to each of the next `num_queries` prompts (and reflection prompts) in
        one engine call, each graded by the env. (groups, (generate_s, grade_s), generated tokens, totals)."""
        prompts: list[tuple[str, str | None, str]] = []  # (query_id, user_content or None, prompt text)
        query_texts: dict[str, str] = {}
        for _ in range(num_queries):
            obs, info = self.env.reset()
            prompts.append((info["query_id"], None, obs))
            query_texts[info["query_id"]] = info.get("query_text", obs)
        fresh_ids = [qid for qid, _, _ in prompts]
        if reflection and self._replay is not None:
            prompts += self._reflection_prompts(fresh_ids, query_texts, reflection)

        prompt_ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for _, _, text in prompts]
        t_gen = time.perf_counter()
        completions = self.engine.generate(prompt_ids, self.config.group_size, self.sampling_params())
        gen_s = time.perf_counter() - t_gen
        if self.config.sleep_between_rollouts:
            self.engine.sleep()  # the learner may use the GPU memory until the next rollout

        t_grade = time.perf_counter()
        groups = []
        version = self.engine.version
        reasons: Counter[str] = (
            Counter()
        )  # the env's grade reasons (info["grade_reason"]), counted in metrics
        for (qid, user_content, text), ids, comps in zip(prompts, prompt_ids, completions, strict=True):
            samples = []
            for c in comps:
                reward, correct, reason, parts = self._score(qid, user_content, c.text)
                if reason is not None and user_content is None:
                    reasons[reason] += 1
                samples.append(
                    Sample(
                        query_id=qid,
                        prompt_ids=list(ids),
                        response_ids=list(c.token_ids),
                        behavior_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                        entropies=np.asarray(c.entropies, dtype=np.float32),
                        reward=reward,
                        correct=correct,
                        truncated=c.truncated,
                        policy_version=oldest_version(c.token_versions, version),
                        token_versions=c.token_versions,
                        response_text=c.text,
                        is_reflection=user_content is not None,
                        grade_reason=reason,
                        reward_parts=parts,
                    )
                )
            groups.append(
                Group(query_id=qid, samples=samples, is_reflection=user_content is not None, prompt_text=text)
            )
        grade_s = time.perf_counter() - t_grade
        gen_tokens = sum(len(c.token_ids) for comps in completions for c in comps)
        totals = rollout_totals(groups) | {f"grade_reason/{r}": float(n) for r, n in reasons.items()}
        return groups, (gen_s, grade_s), gen_tokens, totals

    def _sample_episodes(
        self, num_queries: int, reflection: ReflectionSettings | None
    ) -> tuple[list[Group], tuple[float, float], int, dict[str, float]]:
        """Multi-step rollout: G trajectories of each of the next `num_queries` queries, stepped in lockstep with one
        engine call per step; one group of step samples per query (no reflection prompts: they are single-step)."""
        query_ids = [self.env.reset()[1]["query_id"] for _ in range(num_queries)]
        t_gen = time.perf_counter()
        records = rollout_multistep(
            self.engine,
            self.tokenizer,
            self.env.episode,
            query_ids,
            self.config.group_size,
            self.sampling_params(),
            gamma=self.config.step_gamma,
            max_steps=self.config.max_episode_steps,
        )
        gen_s = time.perf_counter() - t_gen  # env steps included: the gridworld's take microseconds
        if self.config.sleep_between_rollouts:
            self.engine.sleep()
        groups = step_groups(records, self.engine.version)
        check_finite_rewards(groups, type(self.env).__name__)  # before the totals (they refuse NaN, unnamed)
        tokens = sum(len(r.response_ids) for r in records)
        return groups, (gen_s, 0.0), tokens, {**rollout_totals(groups), **episode_totals(records)}

    def _sample_tool_episodes(
        self, num_queries: int, reflection: ReflectionSettings | None
    ) -> tuple[list[Group], tuple[float, float], int, dict[str, float]]:
        """Multi-turn tool use: G trajectories of each of the next `num_queries` queries (and of this rollout's
        reflection prompts), rounds of one engine call each; one sample per trajectory, one group per query."""
        infos = [self.env.reset()[1] for _ in range(num_queries)]
        fresh = [info["query_id"] for info in infos]
        reflect: list[tuple[str, str, str]] = []
        if reflection and self._replay is not None:
            texts = {info["query_id"]: info.get("query_text", "") for info in infos}
            reflect = self._reflection_prompts(fresh, texts, reflection)
        t_gen, version = time.perf_counter(), self.engine.version
        trajs = self._tool_rollout(fresh, self.env.tool_episode, self.sampling_params())
        groups = trajectory_groups(trajs, version)
        if reflect:
            contents = {qid: content for qid, content, _ in reflect}
            extra = self._tool_rollout(
                list(contents), lambda q: self.env.tool_episode(q, contents[q]), self.sampling_params()
            )
            trajs, groups = trajs + extra, groups + trajectory_groups(extra, version, is_reflection=True)
        check_finite_rewards(groups, type(self.env).__name__)
        gen_s = time.perf_counter() - t_gen  # tool calls included
        if self.config.sleep_between_rollouts:
            self.engine.sleep()
        tokens = sum(sum(t.loss_mask) for t in trajs)
        return groups, (gen_s, 0.0), tokens, {**rollout_totals(groups), **tool_use_totals(trajs)}

    def _tool_rollout(self, query_ids, make_episode, params: SamplingParams, group_size: int | None = None):
        c = self.config
        budget = c.max_trajectory_tokens or c.max_tool_turns * c.max_new_tokens
        return rollout_tool_use(
            self.engine,
            self.tokenizer,
            make_episode,
            query_ids,
            group_size or c.group_size,
            params,
            max_turns=c.max_tool_turns,
            max_total_tokens=budget,
        )

    def _score(
        self, query_id: str, user_content: str | None, text: str
    ) -> tuple[float, bool, str | None, dict[str, float] | None]:
        """(reward, correct, grade reason, reward parts) of response ``text`` to the query (or its reflection
        prompt ``user_content``), from the env's ``step``."""
        options, self.query_id = {"query_id": query_id}, query_id
        if user_content is not None:
            options["user_content"] = user_content
        self.env.reset(options=options)
        _, reward, _, _, info = self.env.step(text)
        if "correct" not in info and self._rarity_counts_outcomes():
            raise ValueError(
                f"{type(self.env).__name__}.step() reports no info['correct']: R^2PO's rarity reward "
                "(rollout_head_rarity_count='outcome') counts the graded outcome; report it, or set "
                "rollout_head_rarity_count='reward' for an env whose reward values are its outcomes"
            )
        check_finite_reward(query_id, type(self.env).__name__, reward)
        parts = info.get("reward_components")
        if isinstance(parts, dict):  # numbers only (the records' column is a map of floats)
            parts = {str(k): float(v) for k, v in parts.items() if isinstance(v, numbers.Real)}
        else:
            parts = None
        return float(reward), bool(info.get("correct", reward > 0)), info.get("grade_reason"), parts

    def _rarity_counts_outcomes(self) -> bool:
        c = self.config
        return (
            bool(c.rollout_head)
            and c.rollout_head_advantage == "rarity"
            and c.rollout_head_rarity_count == "outcome"
        )

    def _reflection_prompts(
        self, query_ids: list[str], query_texts: dict[str, str], settings: ReflectionSettings
    ) -> list[tuple[str, str, str]]:
        """Prompts `query + past wrong answer + guidance` for this rollout's hard queries (core/reflection.py
        chooses them from the replay actor's statistics and builds the prompt; the runner renders it with the env).

        A replay actor that died (Ray restarts it, empty, and the algorithm refills it) costs this rollout its
        reflection prompts, not the rollout."""
        try:
            stats = self._replay.query_stats(query_ids)
            scores = {
                q: past_score(stats[q].n_seen, stats[q].n_correct, stats[q].mean_reward, settings.hardness)
                if q in stats
                else None
                for q in query_ids
            }
            hard = select_reflection_queries(scores, settings.tau, settings.max_per_batch)
            wrong = self._replay.sample_wrong_answers(hard, settings.policy_version) if hard else []
        except ray.exceptions.RayActorError as err:
            logger.warning("replay actor unavailable, no reflection prompts in this rollout: %s", err)
            return []
        out = []
        for qid, sample in zip(hard, wrong, strict=True):
            if sample is None:
                continue
            content = settings.prompt(query_texts[qid], sample.response_text)
            obs, _ = self.env.reset(options={"query_id": qid, "user_content": content})
            out.append((qid, content, obs))
        out, self._reflection_dropped = drop_long_prompts(out, self.tokenizer, **self._model_context)
        return out

    # -- weights ------------------------------------------------------------------------------------------------
    def set_weight_board(self, board) -> None:  # partial rollouts: newer weights between decoding steps
        self.engine.between_steps = NewerWeightsPuller(
            board, self.update_weights, lambda: self.engine.version
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
