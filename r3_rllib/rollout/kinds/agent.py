"""Agent rollouts: each episode is an agent program talking to the policy through the EnvRunner's rollout gateway
(:mod:`r3_rllib.gateway`, an OpenAI-compatible endpoint); its training samples are assembled from the calls the
gateway recorded (:mod:`r3_rllib.rollout.trajectories`), token for token.

One rollout takes the next ``num_queries`` queries of an :class:`~r3_rllib.envs.base.AgentEnv` and opens G gateway
sessions per query (and per reflection task), all before any program starts, so the gateway's batches are
deterministic (it batches when every open session has a call pending; its fallback, a call waiting
``gateway_max_batch_wait_s``, is the one timing-dependent path). The programs then run concurrently in one
asyncio loop, each with its own ``openai.AsyncOpenAI`` bound to its session (``max_retries=0``: a call is made
once, so the records are the calls). When a program returns, its session is closed and its records assembled: a
call extending the conversation so far joins its trajectory (the new context tokens masked out of the loss), any
other call starts a step sample of its own. Each episode's samples carry its reward (see
:mod:`~r3_rllib.rollout.trajectories` for how several step samples share it); one group per query holds the
samples of its G episodes.

- **Rewards** are the program's return (``env.run_agent``): a number, or a mapping with ``reward`` and optionally
  ``correct`` (default: the env's rule; ``AgentTextEnv``: reward >= its ``correct_threshold``, 1.0 unless set). A program that raises, returns something else, or runs past
  ``agent_episode_timeout_s`` stops the rollout with :class:`AgentRunError` naming the env, the query and the cause:
  an episode is never silently scored 0. So does an episode that made no model call (nothing to train on).
- **Estimators**: any. Every sample is a step of its episode (``trajectory_id``, ``step_index``, and ``obs_key`` a
  digest of its prompt), so step-level estimators ('hgpo') form step groups; an episode whose program never rewrote
  its history is one step, and those groups are then the query's episodes.
- **R^3**: replay stores the samples with their loss masks; ranking reads the sampled tokens' entropies; reflection
  reruns a hard query's task with ``task["reflection"]`` (:data:`~r3_rllib.envs.agent.REFLECTION_KEY`): the task's
  text, a past wrong answer and the guidance as one user message, which the program may send in place of its own
  first user message (a program that ignores it reruns the task).
- **Versions**: every sampled token keeps the policy version the gateway recorded (partial rollouts); context
  tokens take the version of the token before them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from r3_rllib.core.reflection import ReflectionSettings
from r3_rllib.engines.base import SamplingParams
from r3_rllib.envs.agent import REFLECTION_KEY, episode_outcome
from r3_rllib.envs.base import TextEnv, supports_agent_runs
from r3_rllib.rollout.kinds.base import (
    KindRollout,
    RolloutKind,
    ratio,
    refuse_action_penalty,
    refuse_episode_cap,
    refuse_greedy_baseline,
    refuse_tool_settings,
)
from r3_rllib.rollout.kinds.context import RolloutContext, check_finite_rewards
from r3_rllib.rollout.trajectories import assemble_session, episode_samples
from r3_rllib.types.calls import CallRecord
from r3_rllib.types.samples import Group

#: The API key agent programs' clients send (the gateway checks none: it binds loopback by default).
API_KEY = "r3-rollout"


class AgentRunError(RuntimeError):
    """An agent episode that failed: its program raised, returned no usable reward or ran out of time, or made no
    model call. Names the env, the query and the cause."""

    def __init__(self, query_id: str, env: str, cause: str) -> None:
        self.query_id, self.env, self.cause = query_id, env, cause
        super().__init__(f"{env}: the agent program failed on query {query_id!r}: {cause}")

    def __reduce__(self):
        return (type(self), (self.query_id, self.env, self.cause))


@dataclass
class AgentEpisode:
    """One agent episode: its query and place in the group, its session's records and its outcome; ``step_rewards``
    and ``gamma`` say how its reward is spread over its step samples (:func:`episode_samples`)."""

    query_id: str
    index: int  # 0 .. G-1 within its query
    records: list[CallRecord]
    reward: float
    correct: bool
    info: dict[str, Any] = field(default_factory=dict)
    env: str = ""
    seconds: float = 0.0
    step_rewards: bool = False
    gamma: float = 1.0


@dataclass(frozen=True)
class _Job:
    query_id: str
    index: int
    task: dict[str, Any]


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion in a fresh event loop: in this thread, or in a helper thread when this thread
    already runs a loop (an EnvRunner called from async code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _run_one(env: Any, gateway: Any, session: str, job: _Job, timeout_s: float) -> Any:
    """One program run on its own session; the session is closed whatever happens (the gateway batches the open
    sessions' calls, so an open session nobody calls would hold the others up). ``(value, records, seconds)``, or
    the exception the run raised."""
    import openai

    t0 = time.perf_counter()
    client = openai.AsyncOpenAI(
        base_url=gateway.session_base_url(session), api_key=API_KEY, timeout=timeout_s, max_retries=0
    )
    try:
        value = await asyncio.wait_for(env.run_agent(client, _model_name(gateway), job.task), timeout_s)
    except asyncio.TimeoutError:
        value = TimeoutError(f"did not finish within agent_episode_timeout_s={timeout_s:g} s")
    except Exception as e:  # reported with its query by run_episodes, after every run has ended
        value = e
    finally:
        records = gateway.close_session(session)
        await client.close()
    return value, list(records), time.perf_counter() - t0


def _model_name(gateway: Any) -> str:
    return str(getattr(gateway, "model_name", "policy"))


async def _run_all(env: Any, gateway: Any, jobs: Sequence[_Job], timeout_s: float) -> list[Any]:
    sessions = [gateway.open_session() for _ in jobs]  # all open before any call: deterministic batches
    return await asyncio.gather(
        *(_run_one(env, gateway, s, job, timeout_s) for s, job in zip(sessions, jobs, strict=True))
    )


def run_episodes(
    ctx: RolloutContext, env: Any, jobs: Sequence[_Job], params: SamplingParams
) -> list[AgentEpisode]:
    """Every job's program run, concurrently, against the context's gateway sampling with ``params``; the episodes
    in job order. The first failed job (in job order) raises :class:`AgentRunError`, after every run has ended."""
    gateway = ctx.gateway
    if gateway is None:
        raise RuntimeError(
            f"{ctx.env_name} is an agent env, but this rollout has no gateway to run it against"
        )
    gateway.set_defaults(params)
    config, name = ctx.config, type(env).__name__
    results = run_coroutine(_run_all(env, gateway, jobs, float(config.agent_episode_timeout_s)))
    step_rewards = _is_step_level(config)
    episodes = []
    for job, (value, records, seconds) in zip(jobs, results, strict=True):
        ctx.query_id = job.query_id
        if isinstance(value, BaseException):
            raise AgentRunError(job.query_id, name, f"{type(value).__name__}: {value}") from value
        try:
            outcome = episode_outcome(value)
        except (TypeError, ValueError) as e:
            raise AgentRunError(job.query_id, name, f"its return value: {e}") from e
        if not records:
            raise AgentRunError(job.query_id, name, "it made no model call (an episode needs at least one)")
        reward, correct = outcome.pop("reward"), outcome.pop("correct")
        episodes.append(
            AgentEpisode(
                query_id=job.query_id,
                index=job.index,
                records=records,
                reward=reward,
                correct=correct,
                info=outcome,
                env=name,
                seconds=seconds,
                step_rewards=step_rewards,
                gamma=float(config.step_gamma),
            )
        )
    return episodes


def _is_step_level(config: Any) -> bool:
    from r3_rllib.core.advantages import is_step_level

    return is_step_level(config.advantage_estimator)


def episode_groups(
    episodes: Sequence[AgentEpisode], tokenizer: Any = None, *, is_reflection: bool = False
) -> list[Group]:
    """One group per query (the step samples of its episodes, episode by episode), in the order the queries first
    appear. ``tokenizer`` decodes each sample's response text (context included), else its completions' texts."""
    decode = None if tokenizer is None else (lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    by_query: dict[str, list] = {}
    for ep in episodes:
        by_query.setdefault(ep.query_id, []).extend(
            episode_samples(
                assemble_session(ep.records),
                query_id=ep.query_id,
                episode_id=f"{ep.query_id}#{ep.index}",
                reward=ep.reward,
                correct=ep.correct,
                env=ep.env,
                step_rewards=ep.step_rewards,
                gamma=ep.gamma,
                is_reflection=is_reflection,
                decode=decode,
            )
        )
    return [Group(query_id=q, samples=s, is_reflection=is_reflection) for q, s in by_query.items()]


def agent_totals(episodes: Sequence[AgentEpisode]) -> dict[str, float]:
    """Sums for the rollout metrics: episodes, correct ones, their rewards, model calls, step samples, context and
    sampled tokens, and calls cut at their token limit."""
    trajs = [t for ep in episodes for t in assemble_session(ep.records)]
    calls = [r for ep in episodes for r in ep.records]
    return {
        "agent_episodes": float(len(episodes)),
        "agent_episodes_correct": float(sum(ep.correct for ep in episodes)),
        "agent_episode_reward": float(sum(ep.reward for ep in episodes)),
        "agent_calls": float(len(calls)),
        "agent_calls_length": float(sum(r.finish_reason == "length" for r in calls)),
        "agent_steps": float(len(trajs)),
        "agent_context_tokens": float(sum(t.context_tokens for t in trajs)),
        "agent_sampled_tokens": float(sum(len(r.completion_ids) for r in calls)),
        "agent_episode_s": float(sum(ep.seconds for ep in episodes)),
    }


def reflection_tasks(
    ctx: RolloutContext,
    query_ids: Sequence[str],
    texts: Mapping[str, str],
    settings: ReflectionSettings | None,
) -> dict[str, dict[str, Any]]:
    """The reflection tasks of this rollout's hard queries (none without ``settings`` or a replay actor): each
    query's task with :data:`REFLECTION_KEY` holding the task's text, a past wrong answer and the guidance."""
    if not settings or ctx.past_wrong_answers is None:
        return {}
    out = {}
    for qid, sample in ctx.past_wrong_answers(list(query_ids), settings):
        if sample is not None:
            out[qid] = ctx.env.agent_task(qid) | {
                REFLECTION_KEY: settings.prompt(texts[qid], sample.response_text)
            }
    return out


class AgentKind(RolloutKind[AgentEpisode]):
    """An agent env (``run_agent``): G program runs per query through the runner's gateway, trajectories assembled
    from the recorded calls (see the module)."""

    name = "agent"

    @classmethod
    def matches(cls, env: Any) -> bool:
        return supports_agent_runs(env)

    def sample(
        self, ctx: RolloutContext, num_queries: int, reflection: ReflectionSettings | None
    ) -> KindRollout:
        """G episodes of each of the next `num_queries` queries and of this rollout's reflection tasks, all run
        concurrently."""
        infos = [ctx.env.reset()[1] for _ in range(num_queries)]
        fresh = [info["query_id"] for info in infos]
        texts = {info["query_id"]: info.get("query_text", "") for info in infos}
        reflect = reflection_tasks(ctx, fresh, texts, reflection)
        g = int(ctx.config.group_size)
        jobs = [_Job(q, i, ctx.env.agent_task(q)) for q in fresh for i in range(g)]
        jobs += [_Job(q, i, task) for q, task in reflect.items() for i in range(g)]
        t_gen = time.perf_counter()
        episodes = run_episodes(ctx, ctx.env, jobs, ctx.sampling_params())
        gen_s = time.perf_counter() - t_gen  # the programs' own work (tools) included
        ctx.generation_done()
        n_fresh = len(fresh) * g
        groups = episode_groups(episodes[:n_fresh], ctx.tokenizer)
        groups += episode_groups(episodes[n_fresh:], ctx.tokenizer, is_reflection=True)
        check_finite_rewards(groups, ctx.env_name)
        tokens = sum(len(r.completion_ids) for ep in episodes for r in ep.records)
        return KindRollout(groups, (gen_s, 0.0), tokens, self.totals(groups, episodes[:n_fresh]))

    def to_groups(
        self, records: Sequence[AgentEpisode], policy_version: int, *, is_reflection: bool = False
    ) -> list[Group]:
        """The episodes' groups; each sample's version is its oldest sampled token's, as recorded."""
        return episode_groups(records, is_reflection=is_reflection)

    def record_totals(self, records: Sequence[AgentEpisode]) -> dict[str, float]:
        return agent_totals(records)

    @classmethod
    def means(cls, totals: Mapping[str, float]) -> dict[str, float]:
        """Per episode: model calls, step samples, reward, the share answered correctly and seconds; the share of
        context tokens among the response tokens and of calls cut at their token limit."""
        if not totals.get("agent_episodes"):
            return {}
        return {
            "agent_calls_mean": ratio(totals, "agent_calls", "agent_episodes"),
            "agent_steps_mean": ratio(totals, "agent_steps", "agent_episodes"),
            "agent_reward_mean": ratio(totals, "agent_episode_reward", "agent_episodes"),
            "agent_success_rate": ratio(totals, "agent_episodes_correct", "agent_episodes"),
            "agent_episode_s_mean": ratio(totals, "agent_episode_s", "agent_episodes"),
            "agent_context_token_frac": ratio(totals, "agent_context_tokens", "response_tokens"),
            "agent_calls_length_frac": ratio(totals, "agent_calls_length", "agent_calls"),
        }

    def check_config(self, config: Any, defaults: Mapping[str, Any]) -> None:
        """Any estimator (step-level ones group the episodes' step samples); the tool-use settings shape the
        built-in tool loop, not an agent program, and max_episode_steps caps a multi-step env's episodes (an agent
        program ends its own, within agent_episode_timeout_s): both refused when set, as is invalid_action_penalty
        (an agent program's steps report no invalid action)."""
        refuse_tool_settings(config, defaults)
        refuse_episode_cap(config, "an agent env")
        refuse_greedy_baseline(config, "an agent env")
        refuse_action_penalty(config, defaults, "an agent env")

    def evaluate(
        self,
        ctx: RolloutContext,
        env: TextEnv,
        first: Sequence[tuple[str, dict]],
        per_query: int,
        params: SamplingParams,
    ) -> dict[str, float]:
        """Correct episodes on the queries of `first`, `per_query` each."""
        query_ids = [info["query_id"] for _, info in first]
        jobs = [_Job(q, i, env.agent_task(q)) for q in query_ids for i in range(per_query)]
        episodes = run_episodes(ctx, env, jobs, params) if jobs else []
        return {
            "queries": float(len(query_ids)),
            "samples": float(len(episodes)),
            "correct": float(sum(ep.correct for ep in episodes)),
        }
