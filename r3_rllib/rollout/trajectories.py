"""Training samples from the calls an agent program made through the rollout gateway (pure: records in, samples out).

An agent episode is one gateway session: its :class:`~r3_rllib.types.calls.CallRecord`\\ s in call order, and the
outcome the program returned. :func:`assemble_session` strings the records into token sequences:

- A record whose ``prompt_ids`` start with an existing trajectory's whole token sequence (its prompt and every token
  after it) *extends* that trajectory: the prompt's remaining tokens (the new context: tool results, user turns, the
  chat template's markup) are appended with loss mask 0 (log-prob 0, entropy 0), then the sampled completion with
  mask 1. Of several trajectories it extends, the one extended last is chosen (the gateway renders a turn that
  continues the previous call's conversation so, token for token).
- Any other record (the program rewrote its history, or made a call beside the running conversation) starts a new
  trajectory: a *step sample* of its own, prompt = the call's prompt.

Nothing is re-tokenized: every token of a trajectory is a token of a record (a prompt's or a completion's), so the
tokens trained are the tokens sampled, bit for bit, with their recorded log-probs and policy versions.

:func:`episode_samples` turns an episode's trajectories into :class:`~r3_rllib.types.samples.Sample`\\ s. Each
trajectory is a step of the episode (``trajectory_id`` = the episode, ``step_index`` = its place among the
episode's trajectories, ``obs_key`` = a digest of its prompt tokens, so steps at the same prompt across the group's
episodes form HGPO's step groups). **Reward of several steps**, as in :mod:`r3_rllib.rollout.kinds.multi_step`:

- ``step_rewards=True`` (step-level estimators such as ``hgpo``, which discount returns themselves with
  ``step_gamma``): the episode's reward is the last step's own reward, the earlier steps' is 0;
- ``step_rewards=False`` (estimators that score samples one by one, as ``grpo``): each step carries its discounted
  return, ``gamma ** (T - 1 - t) * reward`` for step ``t`` of ``T`` (with ``gamma`` = 1, every step the episode's
  reward). A one-trajectory episode gets the reward either way.

Every step counts as ``correct`` when the episode does. **An episode without a call** has nothing to train on: it
is refused (:class:`EmptyEpisodeError` naming the query and the env), never turned into an empty sample.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from r3_rllib.types.calls import CallRecord
from r3_rllib.types.samples import Sample


class EmptyEpisodeError(ValueError):
    """An agent episode that made no model call: nothing of it can be trained on. Names the query and the env."""

    def __init__(self, query_id: str, env: str) -> None:
        self.query_id, self.env = query_id, env
        super().__init__(
            f"{env}: the agent program made no model call on query {query_id!r}; an episode must call the model "
            "at least once (through the client it is given) to be trained on"
        )

    def __reduce__(self):
        return (type(self), (self.query_id, self.env))


@dataclass
class Trajectory:
    """One token sequence of a session: the first call's prompt, then the completions of the calls that extended
    it, each after the context tokens that came before it (loss mask 0)."""

    prompt_ids: np.ndarray
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)  # the records' positions in the session, in order
    texts: list[str] = field(default_factory=list)  # the completions' texts
    finish_reason: str = ""  # the last call's

    @property
    def length(self) -> int:
        """Tokens in the whole sequence (prompt and response)."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def context_tokens(self) -> int:
        """Response tokens the model did not sample (loss mask 0)."""
        return len(self.loss_mask) - sum(self.loss_mask)

    def extended_by(self, prompt_ids: np.ndarray) -> bool:
        """Whether ``prompt_ids`` starts with this trajectory's whole token sequence."""
        n, p = len(self.prompt_ids), len(prompt_ids)
        if p < self.length or not np.array_equal(prompt_ids[:n], self.prompt_ids):
            return False
        return np.array_equal(
            prompt_ids[n : self.length], np.asarray(self.response_ids, dtype=prompt_ids.dtype)
        )

    def add_call(self, position: int, record: CallRecord) -> None:
        """Append the record's new context tokens (mask 0, tagged with the version of the token before them) and
        its completion (mask 1, its own log-probs, entropies and versions)."""
        context = record.prompt_ids[self.length :]  # empty for the call that starts the trajectory
        tag = self.token_versions[-1] if self.token_versions else record.policy_version
        n = len(context)
        self.response_ids += [int(x) for x in context]
        self.loss_mask += [False] * n
        self.logprobs += [0.0] * n
        self.entropies += [0.0] * n
        self.token_versions += [int(tag)] * n
        self.response_ids += [int(x) for x in record.completion_ids]
        self.loss_mask += [True] * len(record.completion_ids)
        self.logprobs += [float(x) for x in record.logprobs]
        self.entropies += [float(x) for x in record.entropies]
        self.token_versions += [int(x) for x in record.token_versions]
        self.calls.append(position)
        self.texts.append(record.text)
        self.finish_reason = record.finish_reason


def assemble_session(records: Sequence[CallRecord]) -> list[Trajectory]:
    """A session's trajectories from its records in call order (see the module), in the order they started."""
    trajs: list[Trajectory] = []
    recent: list[int] = []  # trajectory indices, the one extended last at the end
    for position, record in enumerate(records):
        target = next((i for i in reversed(recent) if trajs[i].extended_by(record.prompt_ids)), None)
        if target is None:
            trajs.append(Trajectory(prompt_ids=record.prompt_ids.copy()))
            target = len(trajs) - 1
        else:
            recent.remove(target)
        trajs[target].add_call(position, record)
        recent.append(target)
    return trajs


def prompt_key(prompt_ids: np.ndarray) -> str:
    """A step's observation key: a digest of its prompt tokens (equal prompts, equal keys)."""
    data = np.ascontiguousarray(prompt_ids, dtype=np.int32).tobytes()
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def step_reward(reward: float, step: int, steps: int, *, step_rewards: bool, gamma: float) -> float:
    """The reward step ``step`` of ``steps`` carries (see the module): the episode's on the last step and 0 before
    it (``step_rewards``), else its discounted return."""
    if step_rewards:
        return float(reward) if step == steps - 1 else 0.0
    return float(reward) * float(gamma) ** (steps - 1 - step)


def episode_samples(
    trajs: Sequence[Trajectory],
    *,
    query_id: str,
    episode_id: str,
    reward: float,
    correct: bool,
    env: str,
    step_rewards: bool = False,
    gamma: float = 1.0,
    is_reflection: bool = False,
    decode: Callable[[list[int]], str] | None = None,
) -> list[Sample]:
    """The samples of one episode's trajectories (see the module); ``decode`` (token ids to text) gives each its
    ``response_text`` (context included), else its completions' texts joined. An episode without a trajectory is
    an :class:`EmptyEpisodeError` naming ``query_id`` and ``env``."""
    if not trajs:
        raise EmptyEpisodeError(query_id, env)
    return [
        _sample(
            t,
            query_id=query_id,
            reward=step_reward(reward, step, len(trajs), step_rewards=step_rewards, gamma=gamma),
            correct=correct,
            is_reflection=is_reflection,
            text=decode(t.response_ids) if decode is not None else "".join(t.texts),
            trajectory_id=episode_id,
            step_index=step,
        )
        for step, t in enumerate(trajs)
    ]


def _sample(t: Trajectory, *, query_id: str, reward: float, correct: bool, text: str, **ids: Any) -> Sample:
    mask = np.asarray(t.loss_mask, dtype=bool)
    versions = np.asarray(t.token_versions, dtype=np.int64)
    sampled = versions[mask]
    return Sample(
        query_id=query_id,
        prompt_ids=[int(x) for x in t.prompt_ids],
        response_ids=list(t.response_ids),
        behavior_logprobs=np.asarray(t.logprobs, dtype=np.float32),
        # The model's tokens only (what R^3's ranking reads), as for tool-use trajectories.
        entropies=np.asarray(t.entropies, dtype=np.float32)[mask],
        reward=float(reward),
        correct=bool(correct),
        truncated=t.finish_reason == "length",  # its last call was cut at its token limit
        policy_version=int(sampled.min()) if len(sampled) else 0,
        token_versions=versions,
        response_text=text,
        loss_mask=mask,
        obs_key=prompt_key(t.prompt_ids),
        **ids,
    )
