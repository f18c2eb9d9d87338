"""`R3`: the RLlib Algorithm. One `training_step` = sample groups -> R^3 batch -> learner update -> weight sync.

    EnvRunners (engine + TextEnv)  --RolloutResult-->  coordinator (coordinator.py)  --groups-->
    driver: replay/ranking/advantages (groups.py)  --batch-->  LearnerGroup (R3Learner, FSDP2)
    --weights ObjectRef-->  EnvRunners (weight_sync.py);   replay actor <--> driver, runners

The coordinator schedules the rollouts (overlap, dynamic sampling, timeouts, restarts) and owns the data epoch;
`PolicyWeights` owns the driver's policy version. The replay buffer is a Ray actor of its own: runner or learner
restarts lose nothing, and its state is part of the algorithm's checkpoint (checkpoint.py: a versioned state file);
a restarted replay actor is refilled from the last checkpoint and the journal since (replay/supervisor.py).
"""

from __future__ import annotations

# First: the heavy imports with the collector off, then frozen (frozen_imports.py: 0.84x an actor's import CPU).
from r3_rllib.algorithms.r3 import frozen_imports  # noqa: F401

# isort: split

import functools
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.utils.annotations import override

from r3_rllib.algorithms.r3 import checkpoint_tune, learner_calls
from r3_rllib.algorithms.r3.checkpoint_config import checkpoint_folder
from r3_rllib.algorithms.r3.checkpointing import R3Checkpoints
from r3_rllib.algorithms.r3.config import R3Config
from r3_rllib.algorithms.r3.console import R3Console
from r3_rllib.algorithms.r3.coordinator import RolloutCoordinator
from r3_rllib.algorithms.r3.groups import build_training_batch, rescore_ranking_entropies, rollout_means
from r3_rllib.algorithms.r3.health_monitor import observe_health
from r3_rllib.algorithms.r3.heldout import merge_eval_counts
from r3_rllib.algorithms.r3.iteration_settings import iteration_settings, max_staleness_of
from r3_rllib.algorithms.r3.learner_calls import all_results, collective_results, first_result, to_learners
from r3_rllib.algorithms.r3.learner_faults import learner_death_error
from r3_rllib.algorithms.r3.learner_memory import learner_memory_error
from r3_rllib.algorithms.r3.learner_reward_kl import reward_kl_sums
from r3_rllib.algorithms.r3.partial_rollout import WeightBoard
from r3_rllib.algorithms.r3.r3_schedule import Schedule, log_late_starts, schedule_for_config
from r3_rllib.algorithms.r3.ranking_deferred import build_deferred_batch, defers_ranking, finish_deferred
from r3_rllib.algorithms.r3.reward_kl import RewardKL
from r3_rllib.algorithms.r3.rollout_stages import build_rollout_stages
from r3_rllib.algorithms.r3.rollout_types import Rollout
from r3_rllib.algorithms.r3.runner_group import r3_env_runner_group
from r3_rllib.algorithms.r3.sample_log import SampleLog
from r3_rllib.algorithms.r3.startup import runner_startup_error, start_replay
from r3_rllib.algorithms.r3.streaming import StreamingCoordinator
from r3_rllib.algorithms.r3.weight_sync import PolicyWeights
from r3_rllib.core.iteration import IterationSettings
from r3_rllib.core.method import TrainingPhase, method_for
from r3_rllib.core.metric_groups import log_group
from r3_rllib.core.reward_shaping import without_truncated
from r3_rllib.core.schedules import scheduled_value, shaped_lr
from r3_rllib.core.stream_digest import stream_digest, stream_keys
from r3_rllib.types import TrainingBatch
from r3_rllib.types.samples import Group, Sample

logger = logging.getLogger(__name__)


class R3(R3Console, R3Checkpoints, Algorithm):
    """GRPO-family RL of causal LMs on text environments, with R^3 (replay, reflection, ranking rewards)."""

    @classmethod
    @override(Algorithm)
    def get_default_config(cls) -> R3Config:
        return R3Config()

    # -- setup ----------------------------------------------------------------------------------------------------
    @override(Algorithm)
    def setup(self, config: R3Config) -> None:
        from r3_rllib.warmstart import build_named_models

        build_named_models(config.model_paths)  # runners, learners and stages only resolve a name once built
        try:
            with r3_env_runner_group():  # the runners get the config by value (runner_group.py)
                super().setup(config)
        except Exception:
            # A runner whose constructor raised only shows up later, e.g. as an IndexError in RLlib's get_spaces
            # when every runner failed: report the runner's own error instead (startup.py).
            self._raise_runner_startup_error()
            raise
        self._raise_runner_startup_error()  # some runners failed: a short-handed run would hide it
        self.schedule = self._check_schedule()
        log_late_starts(self.schedule)  # no stop is known here: say when a part switches on (r3_schedule.py)
        self._rng = np.random.default_rng(self.config.seed)
        # Requests, gathers and merges rollouts (overlap, dynamic sampling, timeouts, restarts); owns the data epoch.
        # With max_staleness >= 2 the rollouts stream (streaming.py).
        # With no healthy runner left it waits for Ray to restart them and restores them here (runner_faults.py).
        staleness = max_staleness_of(self.config)
        restore = functools.partial(self.restore_env_runners, self.env_runner_group)
        self.coordinator = (
            StreamingCoordinator(self.env_runner_group, self.config, self.metrics, staleness, restore)
            if staleness >= 2
            else RolloutCoordinator(self.env_runner_group, self.config, self.metrics, restore)
        )
        # The driver's policy version: the version of the weights the runners were last sent.
        board = WeightBoard.remote() if self.config.partial_rollouts else None
        self.weights = PolicyWeights(self.learner_group, self.env_runner_group, board)
        self.coordinator.weights = self.weights  # runner_loss='reask' re-sends a lost request's weights
        self.coordinator.stages = build_rollout_stages(self.config)  # reward server, teacher
        # (query id, policy version) of every sample the last iteration trained, in batch order (chaos tests).
        self.last_trained_stream: list[tuple[str, int]] = []
        self.sample_log = SampleLog.for_algorithm(self)  # sampled completions (sample_log.py)
        if board is not None:
            self.env_runner_group.foreach_env_runner(
                lambda r, b=board: r.set_weight_board(b), local_env_runner=False
            )
        # The replay actor is restarted by Ray after a crash and refilled by its supervisor (replay/supervisor.py).
        self._replay = start_replay(self.config, self.schedule)
        if self._replay is not None:
            self.env_runner_group.foreach_env_runner(
                lambda r, c=self._replay.client: r.set_replay_actor(c), local_env_runner=False
            )
        # Runners start from the same checkpoint as the learner; version 0 on both sides, unless the method's
        # learner-side weights are the ones the runners must sample with from the first rollout on.
        # The training method the config selects (core/method.py).
        self.training_method = method_for(self.config)
        # verl's KL penalty in the reward: its controller's beta, restored from a checkpoint (reward_kl.py).
        self._reward_kl = None
        if self.config.use_kl_in_reward:
            self._reward_kl = RewardKL(self.config, self._learner_reward_kl)
        if self.training_method.sync_before_first_rollout(self.config):
            self.weights.sync()
        # An earlier run's state with this run's settings (config/settings.py resume_from_checkpoint); not in a
        # trial that Tune is about to restore from a newer checkpoint of its own (restarted or resumed).
        resume = self.config.resume_from_checkpoint
        if resume and not checkpoint_tune.trial_restores_itself(getattr(self, "_storage", None)):
            self.restore(checkpoint_folder(resume))

    def _check_schedule(self) -> Schedule | None:
        """The R^3 schedule for the runners' data size (r3_schedule.py): logged, and an error for settings that make
        a part pointless. None when the env has no finite size (then replay_max_age None means no bound)."""
        ids = self.env_runner_group.healthy_worker_ids()[:1]
        sizes = self.env_runner_group.foreach_env_runner(
            lambda r: _env_size(r.env), remote_worker_ids=ids, local_env_runner=not ids
        )
        size = sizes[0] if sizes else None
        if size is None:
            return None
        schedule = schedule_for_config(self.config, size)
        logger.info("R^3 schedule: %s", schedule.summary())
        for warning in schedule.warnings:
            logger.warning("R^3 schedule: %s", warning)
        if schedule.errors:
            raise ValueError("R^3 schedule: " + "; ".join(schedule.errors))
        return schedule

    def _raise_runner_startup_error(self) -> None:
        """Raise EnvRunnerStartupError (runner index and its own message) if a runner failed to start, after
        releasing the runners and learners already built (the caller never gets this Algorithm to stop)."""
        found = runner_startup_error(getattr(self, "env_runner_group", None))
        if found is None:
            return
        error, cause = found
        runners, learners = getattr(self, "env_runner_group", None), getattr(self, "learner_group", None)
        for release in (runners and runners.stop, learners and learners.shutdown):
            try:
                if release:
                    release()
            except Exception:  # cleanup must not hide the start-up error
                logger.exception("cleanup after a failed start")
        raise error from cause

    # -- one iteration ------------------------------------------------------------------------------------------
    @override(Algorithm)
    def training_step(self) -> None:
        cfg: R3Config = self.config
        with self._timed("iteration_s"):
            if self._replay is not None:
                self._replay.check()
            # The R^3 parts on at this data epoch, the estimator's parameters, the training phase of this iteration.
            settings = self.iteration_settings()
            # verl's val_before_train: the policy before any update, once, at the start of the run's first iteration.
            first = cfg.eval_before_train and self.iteration == 0
            log_group(self.metrics, "eval_start", self._evaluation(due=first))
            # 1. Rollouts: groups from the runners (DAPO's dynamic sampling refills; overlap asks for the next, with
            # the settings after this rollout's data epoch, which may have switched reflection on).
            with self._timed("sample_s"):
                groups, rollout = self.coordinator.rollout(
                    settings.reflection,
                    lambda: self.iteration_settings().reflection,
                    self.weights.version,
                    settings.phase,
                )
            # 2. R^3 batch: replay, ranking, advantages; every fresh sample enters the replay buffer.
            with self._timed("r3_batch_s"):
                batch, r3_metrics = self._build_batch(groups, settings.for_batch(cfg))
            # 3. Learner update and 4. weight sync (an iteration with nothing to train skips both).
            learner_metrics: dict[str, float] = {}
            syncing = None
            if batch:
                with self._timed("learner_update_s"):
                    learner_metrics = self._update_learners(batch, settings.phase)
                # The deferred groups' rewards and advantages from the learners (ranking_deferred.py).
                pending = getattr(self, "_pending_ranking", None)
                batch = finish_deferred(batch, r3_metrics, pending, learner_metrics)
                if self._reward_kl is not None:  # 'gae': the learners' current_kl moves beta (reward_kl.py)
                    r3_metrics |= self._reward_kl.observe(learner_metrics)
                # Synchronous loop: the runners load while the driver logs this iteration (collected below).
                syncing = self.weights.start_sync(max_staleness_of(cfg))
            else:
                if cfg.dynamic_sampling:
                    logger.warning(
                        "DAPO: every group was filtered after max_num_gen_batches=%d generation batches: nothing "
                        "trained this iteration (raise max_num_gen_batches or check the rewards)",
                        cfg.max_num_gen_batches,
                    )
                for phase in ("learner_update_s", "weight_sync_s"):
                    self.metrics.log_value(("timers_s", phase), 0.0, reduce="mean", window=1)
            # What this iteration trained, as a digest every run logs (equal digests: the same samples were
            # trained): after the update, which may leave out deferred ranked groups that came out all zero.
            self.last_trained_stream = stream_keys(batch)
            digest = ("rollout", "trained_digest")
            self.metrics.log_value(digest, stream_digest(batch), reduce="mean", window=1)
            try:  # 5. Records and metrics (the runners load meanwhile), then held-out evaluation.
                self.sample_log.record(groups, batch, settings, self.iteration + 1, self.weights.version)
                self._log_metrics(rollout, r3_metrics, learner_metrics, settings.phase)
                observe_health(self, learner_metrics)  # health/* metrics, warnings, NaN stop (health_monitor)
            finally:  # the loads collected even so (a load left in flight would refuse the next rollout request)
                if syncing is not None:  # the driver's time in the sync: its send and its wait for the loads
                    timer = ("timers_s", "weight_sync_s")
                    self.metrics.log_value(timer, syncing.collect(), reduce="mean", window=1)
            # Held-out evaluation: ``eval/*`` in the iterations that evaluate, absent (not NaN) in the others.
            evaluates = bool(cfg.eval_interval) and (self.iteration + 1) % cfg.eval_interval == 0
            log_group(self.metrics, "eval", self._evaluation(due=evaluates))
            # 6. Synchronous loop: the next rollout asked for now, while RLlib and Tune log (prefetch_rollout).
            self.coordinator.prefetch(self.iteration_settings().reflection)
        return None

    def _evaluation(self, *, due: bool) -> dict[str, float]:
        """The run's held-out evaluation (eval_samples responses per query; greedy with 0) when ``due``; else no
        values (the group is absent from the result)."""
        return self.evaluate_heldout(samples=self.config.eval_samples) if due else {}

    def _timed(self, name: str):
        """RLlib's timer block for one phase, reported per iteration as timers_s/<name> (seconds)."""
        return self.metrics.log_time(("timers_s", name), reduce="mean", window=1)

    def _build_batch(
        self, groups: list[Group], settings: IterationSettings
    ) -> tuple[list[Sample], dict[str, float]]:
        fetch = self._fetch_replay if (settings.replay and self._replay_available) else None
        entropy_metrics = {}
        reward_kl = self._reward_kl  # None without use_kl_in_reward
        if reward_kl is not None:  # every row's KL penalty before its group's advantages (reward_kl.py)
            groups, fetch = reward_kl.penalise_groups(groups), reward_kl.fetching(fetch)
        self._pending_ranking = None  # the groups the learners rank (ranking_deferred.py), if any
        if defers_ranking(settings, self.config.ranking_entropies_from_learner):
            batch, r3_metrics, self._pending_ranking = build_deferred_batch(groups, settings, fetch)
        else:
            if settings.ranking and self.config.ranking_entropies_from_learner:
                groups, entropy_metrics = rescore_ranking_entropies(groups, self._learner_entropies)
            batch, r3_metrics = build_training_batch(groups, settings, fetch)
        r3_metrics.update(entropy_metrics)
        if reward_kl is not None:  # current_kl and beta, then the controller's step
            r3_metrics.update(reward_kl.finish())
        # TRL's mask_truncated_completions: after the advantages, which the truncated responses shaped too.
        if self.config.mask_truncated_completions:
            batch, r3_metrics["truncated_masked"] = without_truncated(batch)
        # After the batch is built (a group never replays its own samples). Reflection samples stay out: their
        # prompt is not the query's (see groups.py).
        if self._replay_available:
            fresh_samples = [s.to_replay() for g in groups if not g.is_reflection for s in g.samples]
            self._replay.add(fresh_samples)  # journaled: a restarted replay actor is refilled exactly
        return batch, r3_metrics

    def _learner_entropies(self, samples: list[Sample]) -> list[np.ndarray]:
        """The learners' exact entropies of the samples' response tokens (ranking_entropy_source='learner')."""
        sent = to_learners(self.learner_group, TrainingBatch.from_samples(samples))
        # A forward pass of the sharded policy: collectives, so a learner's failure is seen at once.
        return first_result(
            collective_results(self.learner_group, lambda learner, _sent=sent: learner.score_entropies(_sent))
        )

    def _learner_reward_kl(self, samples: list[Sample]) -> np.ndarray:
        """Each sample's summed KL to the reference over its trained tokens, by the learners (use_kl_in_reward)."""
        sent = to_learners(self.learner_group, TrainingBatch.from_samples(samples))
        return first_result(
            collective_results(self.learner_group, lambda learner, _sent=sent: reward_kl_sums(learner, _sent))
        )

    def _update_learners(self, batch: list[Sample], phase: TrainingPhase | None = None) -> dict[str, float]:
        """One update of every learner on `batch`, sent to them as one columnar `TrainingBatch`, in `phase`."""
        pending = getattr(self, "_pending_ranking", None)
        ranking = pending and pending.description
        beta = self._reward_kl.batch_coef() if self._reward_kl is not None else 0.0  # per-token KL (learners)
        sent = to_learners(
            self.learner_group,
            replace(TrainingBatch.from_samples(batch), ranking=ranking, reward_kl_coef=beta),
        )
        seed = int(self._rng.integers(2**31))
        # `lr` as a schedule (RLlib's form) reads num_env_steps_sampled_lifetime: the samples of the batches
        # before this one (restored with the metrics from a checkpoint); lr_scheduler_type's warm-up and decay read
        # the policy's updates in the iterations before this one (verl's training steps, but PPO's critic warm-up
        # and R^2PO's head stage: the method's count, a function of the restored iteration).
        cfg = self.config
        samples = self.metrics.peek("num_env_steps_sampled_lifetime", default=0.0)
        updates = self.training_method.policy_updates(cfg, self.iteration)
        lr = shaped_lr(scheduled_value(cfg.lr, samples), updates, cfg)
        results = None
        try:
            # A learner's failure is seen at once, not after the collective the others wait in times out.
            results = collective_results(
                self.learner_group,
                lambda learner, _sent=sent, _seed=seed, _phase=phase, _lr=lr: learner.update_from_samples(
                    _sent, seed=_seed, phase=_phase, lr=_lr
                ),
            )
            return first_result(results)
        except Exception as err:
            # A learner process that died: name its rank (the others only report a broken collective), unless
            # Ray's memory monitor killed it (then what to lower is the useful message).
            died = learner_death_error(results or [], int(self.config.num_learners or 0))
            if died is not None and not isinstance(died[1], ray.exceptions.OutOfMemoryError):
                raise died[0] from died[1]
            oom = learner_memory_error(died[1] if died else err, self.config)
            if oom is None:
                raise
            raise oom from err

    def iteration_settings(self) -> IterationSettings:
        """What the next rollout and batch use: the R^3 parts on at the current data epoch, the estimator's
        parameters, the reflection settings for this policy version, the training phase of this iteration
        (iteration_settings.py)."""
        return iteration_settings(
            self.config,
            dataset_epoch=self.coordinator.epoch.value,
            policy_version=self.weights.version,
            iteration=self.iteration,
        )

    @override(Algorithm)
    def restore_env_runners(self, env_runner_group) -> list[int]:
        """Bring back crashed runners and give them what RLlib's default restore cannot: the current policy weights
        (they restart from the initial model) and the replay buffer client."""
        restored = env_runner_group.probe_unhealthy_env_runners()
        if not restored:
            return []
        self._counters["total_num_restored_workers"] += len(restored)
        self.coordinator.runners_restarted(restored)
        if self.weights.board is not None:
            env_runner_group.foreach_env_runner(
                lambda r, b=self.weights.board: r.set_weight_board(b),
                remote_worker_ids=restored,
                local_env_runner=False,
            )
        self.coordinator.push_runner_states(restored)
        if self._replay is not None:
            client = self._replay.client
            env_runner_group.foreach_env_runner(
                lambda r, c=client: r.set_replay_actor(c), remote_worker_ids=restored, local_env_runner=False
            )
        # Some methods' runners need the learner's weights even at version 0 (see setup).
        if self.weights.version > 0 or self.training_method.sync_before_first_rollout(self.config):
            self.weights.sync(remote_worker_ids=restored)
        return restored

    def _fetch_replay(self, requests: list[tuple[str, bool, int]]) -> list[list[Sample]]:
        full = [(qid, want, k, self.weights.version) for qid, want, k in requests]
        got = self._replay.sample_batch(full, [[] for _ in full])
        return [[Sample.from_replay(s) for s in samples] for samples in got]

    @property
    def _replay_available(self) -> bool:
        return self._replay is not None and self._replay.available

    # -- metrics --------------------------------------------------------------------------------------------------
    def _log_metrics(
        self, rollout: Rollout, r3_metrics: dict, learner_metrics: dict, phase: TrainingPhase | None = None
    ) -> None:
        means = rollout_means(rollout.totals)
        reflection = {k: means.pop(k) for k in ("reflection_prompts", "reflection_success")}
        rollout_metrics = {
            **means,
            # After replay and ranking (groups.py); NaN when no fresh group was scored: absent then (below).
            "zero_adv_frac": r3_metrics["zero_adv_frac"],
            "trained_groups": r3_metrics.get("trained_groups", 0.0),  # fresh groups with a nonzero advantage
            "gen_tokens_per_s": rollout.generated_tokens / max(rollout.generate_s, 1e-9),
            "grade_s": rollout.grade_s,
            "runner_idle_s": rollout.runner_idle_s,
            "weight_loads_skipped": float(self.weights.loads_skipped),
            "dataset_epoch": float(self.coordinator.epoch.value),
            "policy_version": float(self.weights.version),
        }
        if math.isnan(rollout_metrics["zero_adv_frac"]):
            # Not measured this iteration: absent from its result, not NaN (core/metric_groups.py). Only the key:
            # the coordinator logged the rest of the group during the rollout.
            del rollout_metrics["zero_adv_frac"]
            self.metrics.delete("rollout", "zero_adv_frac", key_error=False)
        self.metrics.log_dict(rollout_metrics, key="rollout")
        r3 = {k: v for k, v in r3_metrics.items() if k not in ("zero_adv_frac_before", "zero_adv_frac")}
        r3.update(reflection)
        log_group(self.metrics, "r3", r3)  # keys some iterations lack (ranking's, with ranking off): absent
        log_learner_metrics(self.metrics, learner_metrics)
        self.metrics.log_value(
            "num_env_steps_sampled_lifetime", rollout.totals.get("samples", 0.0), reduce="lifetime_sum"
        )
        if self._replay is not None:
            replay_metrics = self._replay.call(lambda replay: replay.metrics(), {})
            log_group(self.metrics, "replay", {**replay_metrics, **self._replay.health_metrics()})
        if phase is not None:  # the method's own metrics
            phase.log_metrics(self.metrics, r3_metrics, learner_metrics)

    def evaluate_heldout(
        self, num_queries: int | None = None, *, with_head: bool | None = None, samples: int = 0
    ) -> dict[str, float]:
        """Greedy accuracy of the current policy on the first `num_queries` held-out queries (multi-step envs:
        success rate, mean episode length, steps to goal); `samples` > 0: the mean over that many sampled responses
        (trajectories) per query instead, with fixed evaluation seeds. The queries are split over the healthy
        runners (heldout.py). `with_head`: whether a policy with an extra rollout head samples with it (None: as
        the config says; runner_eval.py)."""
        n = num_queries or self.config.eval_num_queries
        # Part i of the queries goes to the same runner in every evaluation.
        ids = sorted(self.env_runner_group.healthy_worker_ids())[: max(1, n)]
        parts = self.env_runner_group.foreach_env_runner(
            lambda r, _n=n, _h=with_head, _k=samples, _ids=tuple(ids): r.evaluate(
                _n, with_head=_h, samples=_k, shard=(_ids.index(r.worker_index), len(_ids))
            ),
            remote_worker_ids=ids,
            local_env_runner=False,
        )
        return merge_eval_counts(parts)

    def export_policy(self, path: str | Path, *, with_head: bool = False) -> str:
        """Write the current policy as a Hugging Face folder (loads with AutoModelForCausalLM.from_pretrained),
        with the tokenizer next to it: the inference policy (base logits); `with_head` also writes the files of
        the policy's extra head beside it (learner_state.py). LoRA (lora_rank > 0): the folder holds the
        adapter merged into the base weights, and `path/lora_adapter` the adapter alone (loads with
        `PeftModel.from_pretrained(base, path/lora_adapter)`)."""
        from r3_rllib.algorithms.r3.export import export_algorithm_policy

        return export_algorithm_policy(self, path, with_head=with_head)

    def replay_metrics(self) -> dict[str, float]:
        """The replay actor's metrics (size, bytes, hits, misses, evictions); empty without one."""
        return self._replay.client.metrics() if self._replay is not None else {}

    @override(Algorithm)
    def cleanup(self) -> None:
        try:  # the reward server's and the teacher's actors (none when setup stopped before them)
            for stage in getattr(getattr(self, "coordinator", None), "stages", ()):
                stage.stop()
            # Learners blocked in a collective by a failed partner: stopped now, not after the teardown's timeout.
            learner_calls.stop_stuck_learners(getattr(self, "learner_group", None))
        finally:
            super().cleanup()

    def learner_call(self, fn) -> list[Any]:
        """Run `fn(learner)` on every learner (collective helpers, tests); one learner's error returns at once."""
        return all_results(collective_results(self.learner_group, fn))


def _env_size(env) -> int | None:
    """Number of distinct queries of a runner's env; None for an env without a finite length."""
    try:
        return len(env)
    except TypeError:
        return None


def log_learner_metrics(metrics: Any, learner_metrics: dict[str, float]) -> None:
    """Log this iteration's learner metrics, and only them, under ``learner`` (RLlib would report an earlier
    iteration's key this one lacks as NaN). An iteration that trained nothing reports ``trained_tokens`` 0."""
    log_group(metrics, "learner", learner_metrics or {"trained_tokens": 0.0})
