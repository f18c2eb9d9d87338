"""Held-out evaluation of an `LLMEnvRunner` (a mixin): greedy or sampled responses to the first held-out queries,
counted per runner and merged by the driver (``heldout.merge_eval_counts``). Single-step envs are graded response by
response, multi-step ones as trajectories of steps, tool envs as multi-turn trajectories."""

from __future__ import annotations

from r3_rllib.algorithms.r3.heldout import eval_seed, eval_shard
from r3_rllib.algorithms.r3.runner_setup import build_env, eval_env_config
from r3_rllib.engines.base import SamplingParams
from r3_rllib.envs.base import TextEnv
from r3_rllib.rollout.multistep import episode_stats, rollout_multistep


class HeldOutEvaluation:
    """`evaluate` for `LLMEnvRunner`, which provides ``config``, ``engine``, ``tokenizer``, ``sampling_params``,
    ``_tool_rollout`` and ``_evaluate_part`` (one of the ``_evaluate_*`` methods below, chosen by the env's kind)."""

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
        (None: the config's rollout_head_eval_with_head); training rollouts go back to the head afterwards."""
        set_head = getattr(self.engine, "set_rollout_logits", None)
        if set_head is None:
            return self._evaluate(num_queries, samples, shard)
        if with_head is None:
            with_head = bool(self.config.rollout_head_eval_with_head)
        before = bool(self.engine.rollout_logits)
        set_head(with_head)
        try:
            return self._evaluate(num_queries, samples, shard)
        finally:
            set_head(before)

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
        return self._evaluate_part(env, first, per_query, params)

    def _evaluate_responses(
        self, env: TextEnv, first: list[tuple[str, dict]], per_query: int, params: SamplingParams
    ) -> dict[str, float]:
        """Correct responses to the prompts `first` ((observation, info) of env.reset()), `per_query` each."""
        prompts = [self.tokenizer(obs, add_special_tokens=False)["input_ids"] for obs, _ in first]
        qids = [info["query_id"] for _, info in first]
        comps = self.engine.generate(prompts, per_query, params) if prompts else []
        correct = 0
        for qid, group in zip(qids, comps, strict=True):
            for c in group:
                env.reset(options={"query_id": qid})
                _, _, _, _, info = env.step(c.text)
                correct += bool(info.get("correct"))
        return {
            "queries": float(len(qids)),
            "samples": float(len(qids) * per_query),
            "correct": float(correct),
        }

    def _evaluate_episodes(
        self, env: TextEnv, first: list[tuple[str, dict]], per_query: int, params: SamplingParams
    ) -> dict[str, float]:
        """Successes, trajectory lengths and steps of the successful trajectories on the queries of `first`
        ((observation, info) of env.reset()), `per_query` trajectories each."""
        query_ids = [info["query_id"] for _, info in first]
        counts = {"queries": float(len(query_ids)), "samples": 0.0, "correct": 0.0}
        counts |= {"length_sum": 0.0, "goal_steps_sum": 0.0}
        if not query_ids:
            return counts
        records = rollout_multistep(
            self.engine,
            self.tokenizer,
            env.episode,
            query_ids,
            per_query,
            params,
            gamma=self.config.step_gamma,
            max_steps=self.config.max_episode_steps,
        )
        stats = episode_stats(records)
        wins = stats["successes"]
        counts["samples"] = stats["trajectories"]
        counts["correct"] = wins
        counts["length_sum"] = stats["mean_length"] * stats["trajectories"]
        counts["goal_steps_sum"] = stats["steps_to_goal"] * wins if wins else 0.0
        return counts

    def _evaluate_tool_episodes(
        self, env: TextEnv, first: list[tuple[str, dict]], per_query: int, params: SamplingParams
    ) -> dict[str, float]:
        """Correct trajectories of a multi-turn tool env on the queries of `first`, `per_query` each."""
        query_ids = [info["query_id"] for _, info in first]
        trajs = self._tool_rollout(query_ids, env.tool_episode, params, per_query) if query_ids else []
        return {
            "queries": float(len(query_ids)),
            "samples": float(len(trajs)),
            "correct": float(sum(t.correct for t in trajs)),
        }


def _has_len(env) -> bool:
    try:
        len(env)
    except TypeError:
        return False
    return True
