"""pass@1 of a policy on any text env (``r3 eval --env NAME``): a registered name or a ``"module:Class"`` path, built
with the training run's ``env_config`` and ``split="test"`` (its held-out queries, as the in-training evaluation
builds them from ``eval_env_config``), graded by the env's own ``step``.

The first ``num_queries`` queries the env serves (all of them by default) get ``n`` responses each, sampled as in
training, or one greedy response (``greedy``); a response counts as correct when the env's ``info["correct"]`` says
so (a positive reward when it says nothing). Single-step envs are scored response by response, multi-step envs
(``episode(query_id)``) as trajectories (correct: ended by the env with a positive reward), multi-turn tool envs
(``tool_episode(query_id)``) as tool-use trajectories. One row per env in the report of ``r3 eval``, with the mean
reward beside pass@1 and pass@n.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from r3_rllib.engines.base import GenerationEngine, SamplingParams
from r3_rllib.envs.base import TextEnv, supports_episodes, supports_tool_episodes
from r3_rllib.envs.registry import get_text_env_factory
from r3_rllib.eval.evaluate import BenchmarkResult, EvalReport
from r3_rllib.rollout.kinds.multi_step import rollout_multistep
from r3_rllib.rollout.kinds.tool_use import rollout_tool_use

#: Per query: ([correct], [reward], [response tokens], [truncated]) of its n samples.
Scores = tuple[list[bool], list[float], list[int], list[bool]]


def env_label(env: Any) -> str:
    return env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)


def build_eval_env(
    env: Any, env_config: Mapping[str, Any] | None, tokenizer: Any, split: str | None
) -> TextEnv:
    """The env ``env`` (a name, a ``"module:Class"`` path or a factory) with ``env_config``, the policy's tokenizer
    when it takes one and none is given, and ``split`` when it takes one (an env without a ``split`` option is
    built as configured; ``split=None`` leaves it out)."""
    factory = env if callable(env) else get_text_env_factory(env)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    cfg = dict(env_config or {})
    if "tokenizer" in params and cfg.get("tokenizer") is None:
        cfg["tokenizer"] = tokenizer
    if split is not None and "split" in params:
        cfg["split"] = split
    built = factory(**cfg)
    if not isinstance(built, TextEnv):
        raise TypeError(f"text env {env_label(env)!r} built a {type(built).__name__}, not a TextEnv")
    return built


def takes_split(env: Any) -> bool:
    """Whether the env's factory has a ``split`` option (the held-out queries are its ``split="test"``)."""
    factory = env if callable(env) else get_text_env_factory(env)
    try:
        return "split" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def evaluate_env(
    engine: GenerationEngine,
    tokenizer: Any,
    env: Any,
    env_config: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    n: int = 1,
    greedy: bool = False,
    num_queries: int | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 1024,
    seed: int = 0,
    split: str | None = "test",
    max_tool_turns: int = 4,
) -> EvalReport:
    """Score ``n`` responses (``greedy``: one, at temperature 0) to each of the first ``num_queries`` queries of the
    env (None: all; see the module); one :class:`BenchmarkResult` named ``env:<name>``, with ``mean_reward``.
    ``env``: a name, a ``"module:Class"`` path or a factory, built with ``env_config`` and ``split``
    (:func:`build_eval_env`), or a TextEnv already built (``env_config`` and ``split`` are then not used)."""
    n = 1 if greedy else n
    if n < 1 or (num_queries is not None and num_queries < 1):
        raise ValueError(f"n and num_queries must be >= 1, got {n} and {num_queries}")
    built = env if isinstance(env, TextEnv) else build_eval_env(env, env_config, tokenizer, split)
    label = name or (type(env).__name__ if isinstance(env, TextEnv) else env_label(env))
    count = _query_count(built, num_queries)
    query_ids = [built.reset()[1]["query_id"] for _ in range(count)]
    stop_ids = tuple(i for i in [getattr(tokenizer, "eos_token_id", None)] if i is not None)
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=0.0 if greedy else temperature,
        top_p=1.0 if greedy else top_p,
        stop_token_ids=stop_ids,
        seed=seed,
    )
    if supports_tool_episodes(built):
        budget = max_tool_turns * max_new_tokens
        trajs = rollout_tool_use(
            engine,
            tokenizer,
            built.tool_episode,
            query_ids,
            n,
            params,
            max_turns=max_tool_turns,
            max_total_tokens=budget,
        )
        scores = [_tool_scores(trajs[i * n : (i + 1) * n]) for i in range(len(query_ids))]
    elif supports_episodes(built):
        scores = _episode_scores(
            rollout_multistep(engine, tokenizer, built.episode, query_ids, n, params), query_ids
        )
    else:
        scores = _response_scores(engine, tokenizer, built, query_ids, n, params)
    result = _result(f"env:{label}", query_ids, scores)
    config = {
        "env": label,
        "split": split,
        "n": n,
        "greedy": greedy,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_new_tokens": max_new_tokens,
        "num_queries": count,
        "seed": seed,
    }
    return EvalReport(results=[result], config=config)


def _query_count(env: TextEnv, num_queries: int | None) -> int:
    try:
        size = len(env)
    except TypeError:
        if num_queries is None:
            raise ValueError(
                f"{type(env).__name__} has no finite length: give the number of queries"
            ) from None
        return num_queries
    return size if num_queries is None else min(num_queries, size)


def _result(name: str, query_ids: list[str], scores: list[Scores]) -> BenchmarkResult:
    correct, rewards, lengths, truncated = (list(part) for part in zip(*scores, strict=True))
    result = BenchmarkResult.from_samples(name, query_ids, correct, lengths, truncated)
    return replace(result, mean_reward=float(np.mean([r for row in rewards for r in row])))


def _response_scores(
    engine: GenerationEngine,
    tokenizer: Any,
    env: TextEnv,
    query_ids: list[str],
    n: int,
    params: SamplingParams,
) -> list[Scores]:
    """Single-step: each prompt's ``n`` responses, each scored by ``env.step`` after a reset to its query."""
    prompts = [env.reset(options={"query_id": qid})[0] for qid in query_ids]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    groups = engine.generate(prompt_ids, n, params)
    if len(groups) != len(prompt_ids) or any(len(g) != n for g in groups):
        raise RuntimeError(
            f"engine returned {[len(g) for g in groups]} completions for {len(prompt_ids)} x n={n}"
        )
    scores: list[Scores] = []
    for qid, group in zip(query_ids, groups, strict=True):
        correct, rewards = [], []
        for c in group:
            env.reset(options={"query_id": qid})
            text = c.text or tokenizer.decode(c.token_ids, skip_special_tokens=False)
            _, reward, _, _, info = env.step(text)
            rewards.append(float(reward))
            correct.append(bool(info.get("correct", reward > 0)))
        scores.append((correct, rewards, [len(c.token_ids) for c in group], [c.truncated for c in group]))
    return scores


def _episode_scores(records: list[Any], query_ids: list[str]) -> list[Scores]:
    """Multi-step: per query, its trajectories in order (correct: ended by the env with a positive reward)."""
    trajs: dict[str, dict[int, list[Any]]] = {qid: {} for qid in query_ids}
    for r in records:
        trajs[r.query_id].setdefault(r.traj_id, []).append(r)
    scores: list[Scores] = []
    for qid in query_ids:
        steps = [trajs[qid][t] for t in sorted(trajs[qid])]
        scores.append(
            (
                [t[-1].terminated and t[-1].reward > 0 for t in steps],
                [float(sum(s.reward for s in t)) for t in steps],
                [sum(len(s.response_ids) for s in t) for t in steps],
                [bool(t[-1].truncated) for t in steps],
            )
        )
    return scores


def _tool_scores(trajs: list[Any]) -> Scores:
    return (
        [bool(t.correct) for t in trajs],
        [float(t.reward) for t in trajs],
        [int(sum(t.loss_mask)) for t in trajs],
        [t.finish_reason != "answer" for t in trajs],
    )
