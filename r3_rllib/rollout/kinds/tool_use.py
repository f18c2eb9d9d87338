"""Multi-turn tool use: one trajectory (model turns and tool outputs in one token sequence) is ONE training sample.

Token in, token out: every round sends each active trajectory's whole token sequence so far (prompt, earlier model
turns, tool outputs) to the engine as the prompt, and appends the sampled tokens exactly as sampled; a tool's output
is rendered as text, tokenized alone and appended. Earlier turns are never re-tokenized, so the tokens the learner
trains on are exactly the ones the engine sampled. The loss mask covers model tokens only (tool tokens carry mask
0, log-prob 0 and entropy 0). A trajectory ends when a model turn calls no tool (its final answer), after
``max_turns`` model turns, or when it reaches ``max_total_tokens`` response tokens; the episode then gives the
outcome reward.

The rounds are lockstep, as in :mod:`r3_rllib.rollout.kinds.multi_step`: one batched ``engine.generate`` per round
over every active trajectory of every query; the tool calls of a round run concurrently. One trajectory becomes one
training sample (:func:`trajectory_sample`), one group per query. No Ray here: the env runner calls this through
:class:`ToolUseKind`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from r3_rllib.core.reflection import ReflectionSettings
from r3_rllib.engines.base import GenerationEngine, SamplingParams
from r3_rllib.envs.base import TextEnv, ToolEpisode, supports_tool_episodes
from r3_rllib.rollout.kinds.base import (
    KindRollout,
    RolloutKind,
    oldest_version,
    ratio,
    refuse_action_penalty,
    refuse_agent_settings,
    refuse_episode_cap,
    refuse_greedy_baseline,
    refuse_step_discount,
    refuse_step_level_estimator,
)
from r3_rllib.rollout.kinds.context import RolloutContext, check_finite_rewards
from r3_rllib.types.samples import Group, Sample


@dataclass
class ToolTrajectory:
    """One trajectory: the prompt, then model and tool tokens, one training sample."""

    query_id: str
    traj_id: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)  # model and tool tokens after the prompt
    loss_mask: list[int] = field(default_factory=list)  # 1: sampled by the model; 0: tool output
    logprobs: list[float] = field(default_factory=list)  # behaviour log-probs (0 on tool tokens)
    entropies: list[float] = field(default_factory=list)
    model_text: list[str] = field(default_factory=list)  # the model's turns, in order
    text: str = ""  # model turns and tool outputs as one text (for logs and reflection)
    turns: int = 0
    tool_calls: int = 0
    finish_reason: str = ""  # "answer", "turns", "budget" or "length" (a model turn hit max_new_tokens)
    # The policy version of each response token (see append).
    token_versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    correct: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    def append(
        self, ids: Sequence[int], *, sampled: bool, logprobs=None, entropies=None, versions=None
    ) -> None:
        """Add tokens: the model's (``sampled``; their log-probs, entropies and policy versions) or a tool's (no
        loss; tagged with the version of the token before them, so the tags stay in order)."""
        n = len(ids)
        last = self.token_versions[-1] if self.token_versions else 0
        self.token_versions += [last] * n if versions is None else [int(v) for v in versions]
        self.response_ids += list(map(int, ids))
        self.loss_mask += [int(sampled)] * n
        self.logprobs += [0.0] * n if logprobs is None else [float(x) for x in logprobs]
        self.entropies += [0.0] * n if entropies is None else [float(x) for x in entropies]


def rollout_tool_use(
    engine: GenerationEngine,
    tokenizer: Any,
    make_episode: Callable[[str], ToolEpisode],
    query_ids: Sequence[str],
    group_size: int,
    params: SamplingParams,
    *,
    max_turns: int = 4,
    max_total_tokens: int = 1024,
    tool_workers: int = 4,
) -> list[ToolTrajectory]:
    """Roll out ``group_size`` tool-using trajectories per query in lockstep (see the module docstring); returns
    them grouped by query, then trajectory. ``max_total_tokens`` bounds each trajectory's response tokens (model
    and tool); a model turn gets at most ``params.max_new_tokens`` and what remains of that budget."""
    _check(group_size, max_turns, max_total_tokens, query_ids)
    episodes = [make_episode(qid) for qid in query_ids for _ in range(group_size)]
    trajs = [
        ToolTrajectory(qid, g, tokenizer.encode(ep.prompt, add_special_tokens=False))
        for (qid, g), ep in zip([(q, g) for q in query_ids for g in range(group_size)], episodes, strict=True)
    ]
    with ThreadPoolExecutor(max_workers=max(1, tool_workers)) as pool:
        for round_index in range(max_turns):
            active = [i for i, t in enumerate(trajs) if not t.done]
            if not active:
                break
            _model_round(engine, params, [trajs[i] for i in active], max_total_tokens, round_index)
            last_round = round_index == max_turns - 1
            _tool_round(
                pool, tokenizer, [(trajs[i], episodes[i]) for i in active], max_total_tokens, last_round
            )
    for traj, episode in zip(trajs, episodes, strict=True):
        traj.reward, traj.correct, traj.info = episode.finish("".join(traj.model_text))
        traj.reward = float(traj.reward)
    return trajs


def _check(group_size: int, max_turns: int, max_total_tokens: int, query_ids: Sequence[str]) -> None:
    if group_size < 1 or max_turns < 1 or max_total_tokens < 1:
        raise ValueError(
            f"need group_size, max_turns and max_total_tokens >= 1; got {group_size}, {max_turns}, "
            f"{max_total_tokens}"
        )
    if not query_ids:
        raise ValueError("rollout_tool_use needs at least one query")


def _model_round(
    engine: GenerationEngine,
    params: SamplingParams,
    trajs: list[ToolTrajectory],
    max_total_tokens: int,
    round_index: int,
) -> None:
    """One model turn for every trajectory in `trajs`, in one batched call per distinct token allowance."""
    by_allowance: dict[int, list[ToolTrajectory]] = {}
    for t in trajs:
        allowance = min(params.max_new_tokens, max_total_tokens - len(t.response_ids))
        by_allowance.setdefault(allowance, []).append(t)
    for allowance, group in by_allowance.items():
        seed = None if params.seed is None else params.seed + round_index
        prompts = [t.prompt_ids + t.response_ids for t in group]
        call_version = engine.version
        results = engine.generate(prompts, 1, replace(params, max_new_tokens=allowance, seed=seed))
        for t, result in zip(group, results, strict=True):
            c = result[0]
            versions = c.token_versions if c.token_versions is not None else [call_version] * len(c.token_ids)
            t.append(c.token_ids, sampled=True, logprobs=c.logprobs, entropies=c.entropies, versions=versions)
            t.model_text.append(c.text)
            t.text += c.text
            t.turns += 1
            if c.finish_reason == "length":
                t.finish_reason = "budget" if len(t.response_ids) >= max_total_tokens else "length"


def _tool_round(
    pool: ThreadPoolExecutor,
    tokenizer: Any,
    pairs: list[tuple[ToolTrajectory, ToolEpisode]],
    max_total_tokens: int,
    last_round: bool,
) -> None:
    """Run the tool calls of the turns just sampled (concurrently) and append their outputs as tool tokens."""
    pending = [(t, ep) for t, ep in pairs if not t.done]
    replies = list(pool.map(lambda pair: pair[1].tool_reply(pair[0].model_text[-1]), pending))
    for (t, _), reply in zip(pending, replies, strict=True):
        if reply is None:
            t.finish_reason = "answer"
            continue
        t.tool_calls += 1
        if last_round:
            t.finish_reason = "turns"  # the model would get no turn to read the output: do not append it
            continue
        ids = tokenizer.encode(reply, add_special_tokens=False)
        room = max_total_tokens - len(t.response_ids)
        t.append(ids[:room], sampled=False)
        t.text += reply
        if len(ids) >= room:
            t.finish_reason = "budget"


def tool_use_totals(trajs: Sequence[ToolTrajectory]) -> dict[str, float]:
    """Sums for the rollout metrics: trajectories, model turns, tool calls, tool tokens, and finish reasons."""
    totals = {
        "tool_trajectories": float(len(trajs)),
        "tool_turns": float(sum(t.turns for t in trajs)),
        "tool_calls": float(sum(t.tool_calls for t in trajs)),
        "tool_tokens": float(sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajs)),
    }
    for reason in ("answer", "turns", "budget", "length"):
        totals[f"tool_finish_{reason}"] = float(sum(t.finish_reason == reason for t in trajs))
    return totals


def response_arrays(traj: ToolTrajectory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trajectory's behaviour log-probs, entropies and loss mask as arrays (float32, float32, bool)."""
    return (
        np.asarray(traj.logprobs, dtype=np.float32),
        np.asarray(traj.entropies, dtype=np.float32),
        np.asarray(traj.loss_mask, dtype=bool),
    )


def trajectory_sample(traj: ToolTrajectory, policy_version: int, *, is_reflection: bool = False) -> Sample:
    """The training sample of one trajectory. Its entropies are the model tokens' only (what R^3's ranking reads:
    a tool's output is not the policy's uncertainty); ``truncated`` when a turn or the token budget cut it."""
    logprobs, entropies, mask = response_arrays(traj)
    versions = np.asarray(traj.token_versions, dtype=np.int64)
    tagged = versions if len(versions) == len(mask) else None  # a trajectory built without append has no tags
    return Sample(
        query_id=traj.query_id,
        prompt_ids=list(traj.prompt_ids),
        response_ids=list(traj.response_ids),
        behavior_logprobs=logprobs,
        entropies=entropies[mask],
        reward=float(traj.reward),
        correct=bool(traj.correct),
        truncated=traj.finish_reason in ("length", "budget"),
        # The oldest weights that sampled any of its model tokens (turns may follow a weight pull).
        policy_version=oldest_version(None if tagged is None else tagged[mask], policy_version),
        token_versions=tagged,
        response_text=traj.text,
        is_reflection=is_reflection,
        loss_mask=mask,
    )


def trajectory_groups(
    trajs: Sequence[ToolTrajectory], policy_version: int, *, is_reflection: bool = False
) -> list[Group]:
    """One group per query (its G trajectories), in the order the queries first appear."""
    by_query: dict[str, list[Sample]] = {}
    for t in trajs:
        by_query.setdefault(t.query_id, []).append(
            trajectory_sample(t, policy_version, is_reflection=is_reflection)
        )
    return [Group(query_id=q, samples=s, is_reflection=is_reflection) for q, s in by_query.items()]


class ToolUseKind(RolloutKind[ToolTrajectory]):
    """A multi-turn tool env (``tool_episode(query_id, user_content=None)``): token-in/token-out trajectories, one
    sample each, tool tokens masked out of the loss; R^3's reflection prompts are trajectories of their own."""

    name = "tool use"

    @classmethod
    def matches(cls, env: Any) -> bool:
        return supports_tool_episodes(env)

    def sample(
        self, ctx: RolloutContext, num_queries: int, reflection: ReflectionSettings | None
    ) -> KindRollout:
        """G trajectories of each of the next `num_queries` queries (and of this rollout's reflection prompts),
        rounds of one engine call each."""
        infos = [ctx.env.reset()[1] for _ in range(num_queries)]
        fresh = [info["query_id"] for info in infos]
        texts = {info["query_id"]: info.get("query_text", "") for info in infos}
        reflect = ctx.reflection_prompts(fresh, texts, reflection)
        t_gen, version = time.perf_counter(), ctx.engine.version
        trajs = self._rollout(ctx, fresh, ctx.env.tool_episode, ctx.sampling_params())
        groups = self.to_groups(trajs, version)
        if reflect:
            contents = {qid: content for qid, content, _ in reflect}
            extra = self._rollout(
                ctx, list(contents), lambda q: ctx.env.tool_episode(q, contents[q]), ctx.sampling_params()
            )
            trajs, groups = trajs + extra, groups + self.to_groups(extra, version, is_reflection=True)
        check_finite_rewards(groups, ctx.env_name)
        gen_s = time.perf_counter() - t_gen  # tool calls included
        ctx.generation_done()
        tokens = sum(sum(t.loss_mask) for t in trajs)
        return KindRollout(groups, (gen_s, 0.0), tokens, self.totals(groups, trajs))

    def to_groups(
        self, records: Sequence[ToolTrajectory], policy_version: int, *, is_reflection: bool = False
    ) -> list[Group]:
        return trajectory_groups(records, policy_version, is_reflection=is_reflection)

    def record_totals(self, records: Sequence[ToolTrajectory]) -> dict[str, float]:
        return tool_use_totals(records)

    @classmethod
    def means(cls, totals: Mapping[str, float]) -> dict[str, float]:
        """Per trajectory: tool calls, model turns, the share of tool tokens and of trajectories that answered."""
        if not totals.get("tool_trajectories"):
            return {}
        return {
            "tool_calls_mean": ratio(totals, "tool_calls", "tool_trajectories"),
            "tool_turns_mean": ratio(totals, "tool_turns", "tool_trajectories"),
            "tool_token_frac": ratio(totals, "tool_tokens", "response_tokens"),
            "tool_finish_answer_frac": ratio(totals, "tool_finish_answer", "tool_trajectories"),
        }

    def check_config(self, config: Any, defaults: Mapping[str, Any]) -> None:
        """No step-level estimator: a trajectory is one sample (the tool settings are this kind's, the episode cap
        is not: max_tool_turns bounds a trajectory)."""
        refuse_step_level_estimator(config)
        refuse_episode_cap(config, "a multi-turn tool env")
        refuse_greedy_baseline(config, "a multi-turn tool env")
        refuse_agent_settings(config, defaults, "a multi-turn tool env")
        refuse_step_discount(config, defaults, "a multi-turn tool env")
        refuse_action_penalty(config, defaults, "a multi-turn tool env")

    def evaluate(
        self,
        ctx: RolloutContext,
        env: TextEnv,
        first: Sequence[tuple[str, dict]],
        per_query: int,
        params: SamplingParams,
    ) -> dict[str, float]:
        """Correct trajectories on the queries of `first`, `per_query` each."""
        query_ids = [info["query_id"] for _, info in first]
        trajs = self._rollout(ctx, query_ids, env.tool_episode, params, per_query) if query_ids else []
        return {
            "queries": float(len(query_ids)),
            "samples": float(len(trajs)),
            "correct": float(sum(t.correct for t in trajs)),
        }

    @staticmethod
    def _rollout(
        ctx: RolloutContext,
        query_ids: list[str],
        make_episode: Callable[[str], ToolEpisode],
        params: SamplingParams,
        group_size: int | None = None,
    ) -> list[ToolTrajectory]:
        """:func:`rollout_tool_use` with the run's turn and token limits (``max_trajectory_tokens``, else
        ``max_tool_turns`` x ``max_new_tokens``)."""
        c = ctx.config
        budget = c.max_trajectory_tokens or c.max_tool_turns * c.max_new_tokens
        return rollout_tool_use(
            ctx.engine,
            ctx.tokenizer,
            make_episode,
            query_ids,
            group_size or c.group_size,
            params,
            max_turns=c.max_tool_turns,
            max_total_tokens=budget,
        )
