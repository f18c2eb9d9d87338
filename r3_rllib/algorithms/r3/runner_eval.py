"""Held-out evaluation of an `LLMEnvRunner` (a mixin): greedy or sampled responses to the first held-out queries,
counted per runner and merged by the driver (``heldout.merge_eval_counts``). The runner's rollout kind scores them
(``RolloutKind.evaluate``: single-step envs response by response, multi-step ones as trajectories of steps, tool envs
as multi-turn trajectories)."""

from __future__ import annotations

from r3_rllib.algorithms.r3.heldout import eval_seed, eval_shard
from r3_rllib.algorithms.r3.runner_setup import build_env, eval_env_config


class HeldOutEvaluation:
    """`evaluate` for `LLMEnvRunner`, which provides ``config``, ``engine``, ``tokenizer``, ``sampling_params``,
    ``kind`` (its `RolloutKind`), ``rollout_context()`` and ``phase_threads()`` (the engine's threads for a phase)."""

    def evaluate(
        self,
        num_queries: int,
        *,
        with_head: bool | None = None,
        samples: int = 0,
        shard: tuple[int, int] = (0, 1),
    ) -> dict[str, float]:
        """Counts of a held-out evaluation (merged by `heldout.merge_eval_counts`) on part ``shard = (index,
        count)`` of the first `num_queries` held-out queries (env_config updated with `eval_env_config`); the same
        queries every call, so evaluations are comparable. Greedy, one response per query; `samples` > 0: that many
        responses (trajectories) per query sampled as in training, with the part's fixed evaluation seed.

        R^2PO: evaluated with base logits (head off: the policy that is exported and served) unless `with_head`
        (None: the config's rollout_head_eval_with_head); training rollouts go back to the head afterwards.

        Threads as for a rollout: the cores free now, up to the runner's plan, then back to its reservation."""
        with self.phase_threads():
            return self._evaluate_policy(num_queries, with_head, samples, shard)

    def _evaluate_policy(
        self, num_queries: int, with_head: bool | None, samples: int, shard: tuple[int, int]
    ) -> dict[str, float]:
        engine = self.engine
        if not engine.supports_rollout_logits:  # no rollout head: the base logits are all there is
            return self._evaluate(num_queries, samples, shard)
        if with_head is None:
            with_head = bool(self.config.rollout_head_eval_with_head)
        before = bool(engine.rollout_logits)
        engine.set_rollout_logits(with_head)
        try:
            return self._evaluate(num_queries, samples, shard)
        finally:
            engine.set_rollout_logits(before)

    def _evaluate(self, num_queries: int, samples: int, shard: tuple[int, int]) -> dict[str, float]:
        if self._eval_env is None:
            self._eval_env = build_env(self.config.env, eval_env_config(self.config), self.tokenizer)
            self._eval_start = self._eval_env.state()
        env = self._eval_env
        env.set_state(self._eval_start)
        n = min(num_queries, len(env)) if _has_len(env) else num_queries
        part = eval_shard(n, *shard)
        per_query = max(1, samples)
        params = self.sampling_params(greedy=samples < 1, seed=eval_seed(self.config.seed or 0, shard[0]))
        first = [env.reset() for _ in range(part.stop)][part.start :]
        return self.kind.evaluate(self.rollout_context(), env, first, per_query, params)


def _has_len(env) -> bool:
    try:
        len(env)
    except TypeError:
        return False
    return True
