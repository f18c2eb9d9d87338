"""Assembling training samples from a gateway session's call records (pure): extension, rewritten histories and
parallel calls, loss masks, log-probs, versions, rewards spread over step samples, and the empty episode."""

from __future__ import annotations

import numpy as np
import pytest

from r3_rllib.rollout.trajectories import (
    EmptyEpisodeError,
    assemble_session,
    episode_samples,
    prompt_key,
    step_reward,
)
from r3_rllib.types.calls import CallRecord


def rec(index, prompt, completion, *, version=0, finish="stop", text=None, base=0.0):
    """A record whose log-probs / entropies are distinct per token (``base`` + position / 10)."""
    n = len(completion)
    return CallRecord(
        session_id="s",
        index=index,
        endpoint="chat",
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-(base + i / 10) for i in range(n)],
        entropies=[base + i / 10 + 0.05 for i in range(n)],
        token_versions=[version] * n if isinstance(version, int) else version,
        finish_reason=finish,
        text=text if text is not None else "".join(chr(96 + t % 26) for t in completion),
    )


def f32(xs):
    return np.asarray(xs, dtype=np.float32)


def test_a_call_extending_the_conversation_joins_its_trajectory_with_context_masked():
    r0 = rec(0, [1, 2, 3], [10, 11], base=1.0)
    r1 = rec(1, [1, 2, 3, 10, 11, 20, 21, 22], [30, 31, 32], base=2.0, version=1)
    [t] = assemble_session([r0, r1])
    assert list(t.prompt_ids) == [1, 2, 3]
    assert t.response_ids == [10, 11, 20, 21, 22, 30, 31, 32]
    assert t.loss_mask == [True, True, False, False, False, True, True, True]
    np.testing.assert_array_equal(f32(t.logprobs), f32([-1.0, -1.1, 0, 0, 0, -2.0, -2.1, -2.2]))
    np.testing.assert_array_equal(f32(t.entropies), f32([1.05, 1.15, 0, 0, 0, 2.05, 2.15, 2.25]))
    # Context tokens take the version of the token before them; the completion keeps its own.
    assert t.token_versions == [0, 0, 0, 0, 0, 1, 1, 1]
    assert t.calls == [0, 1] and t.context_tokens == 3 and t.finish_reason == "stop"
    # Every token of the trajectory is a token of a record: prompt + completion of the last call, bit for bit.
    assert [*t.prompt_ids, *t.response_ids] == [*r1.prompt_ids, *r1.completion_ids]


def test_a_call_with_no_new_context_tokens_still_joins():
    [t] = assemble_session([rec(0, [1, 2], [3]), rec(1, [1, 2, 3], [4])])
    assert t.response_ids == [3, 4] and t.loss_mask == [True, True]


def test_a_rewritten_history_starts_a_new_step_sample():
    r0 = rec(0, [1, 2, 3], [10, 11])
    r1 = rec(1, [1, 2, 3, 10, 99, 20], [30])  # the assistant reply was edited: not an extension
    r2 = rec(2, [5, 6], [40, 41])  # a fresh, summarised history
    trajs = assemble_session([r0, r1, r2])
    assert [list(t.prompt_ids) for t in trajs] == [[1, 2, 3], [1, 2, 3, 10, 99, 20], [5, 6]]
    assert [t.response_ids for t in trajs] == [[10, 11], [30], [40, 41]]
    assert all(all(t.loss_mask) for t in trajs)


def test_a_prompt_shorter_than_the_trajectory_or_a_parallel_call_starts_anew():
    r0 = rec(0, [1, 2, 3], [10, 11])
    r1 = rec(1, [1, 2, 3], [12])  # the same prompt again (a parallel call / a second choice)
    r2 = rec(2, [1, 2, 3, 10], [13])  # a prefix of the trajectory only
    assert len(assemble_session([r0, r1, r2])) == 3


def test_interleaved_conversations_each_extend_their_own_trajectory():
    main0 = rec(0, [1, 2], [3])
    sub0 = rec(1, [7, 8], [9])
    main1 = rec(2, [1, 2, 3, 4], [5])
    sub1 = rec(3, [7, 8, 9, 6], [6])
    main, sub = assemble_session([main0, sub0, main1, sub1])
    assert main.response_ids == [3, 4, 5] and main.loss_mask == [True, False, True] and main.calls == [0, 2]
    assert sub.response_ids == [9, 6, 6] and sub.loss_mask == [True, False, True] and sub.calls == [1, 3]


def test_of_two_trajectories_extended_the_one_extended_last_takes_the_call():
    # Two trajectories with the same full sequence: the later one continues.
    trajs = assemble_session([rec(0, [1], [2]), rec(1, [1, 2], []), rec(2, [1], [2]), rec(3, [1, 2, 3], [4])])
    assert [t.calls for t in trajs] == [[0, 1], [2, 3]]


def test_samples_carry_masks_versions_and_the_episode_reward():
    r0 = rec(0, [1, 2, 3], [10, 11], version=3, base=1.0)
    r1 = rec(1, [1, 2, 3, 10, 11, 20], [30, 31], version=[4, 5], base=2.0, finish="length")
    [s] = episode_samples(
        assemble_session([r0, r1]), query_id="q", episode_id="q#2", reward=0.7, correct=True, env="E"
    )
    assert s.prompt_ids == [1, 2, 3] and s.response_ids == [10, 11, 20, 30, 31]
    np.testing.assert_array_equal(s.loss_mask, [True, True, False, True, True])
    np.testing.assert_array_equal(s.behavior_logprobs, f32([-1.0, -1.1, 0.0, -2.0, -2.1]))
    np.testing.assert_array_equal(s.entropies, f32([1.05, 1.15, 2.05, 2.15]))  # the model's tokens only
    np.testing.assert_array_equal(s.token_versions, [3, 3, 3, 4, 5])
    assert s.policy_version == 3 and s.reward == 0.7 and s.env_reward == 0.7 and s.correct
    assert s.truncated  # its last call hit the token limit
    assert s.trajectory_id == "q#2" and s.step_index == 0 and s.obs_key == prompt_key(np.array([1, 2, 3]))
    assert s.response_text == r0.text + r1.text
    replayed = s.to_replay()  # replay keeps the mask
    np.testing.assert_array_equal(replayed.loss_mask, s.loss_mask)


def test_step_samples_share_the_episode_and_their_rewards_follow_the_estimator():
    records = [rec(0, [1, 2], [3]), rec(1, [4], [5]), rec(2, [6], [7])]
    trajs = assemble_session(records)
    kw = {"query_id": "q", "episode_id": "q#0", "reward": 2.0, "correct": True, "env": "E"}
    steps = episode_samples(trajs, step_rewards=True, **kw)
    assert [s.reward for s in steps] == [0.0, 0.0, 2.0]
    assert [s.step_index for s in steps] == [0, 1, 2] and {s.trajectory_id for s in steps} == {"q#0"}
    assert all(s.correct for s in steps)
    returns = episode_samples(trajs, gamma=0.5, **kw)
    assert [s.reward for s in returns] == [0.5, 1.0, 2.0]
    assert [s.reward for s in episode_samples(trajs, **kw)] == [2.0, 2.0, 2.0]
    assert (
        step_reward(2.0, 0, 1, step_rewards=True, gamma=0.5)
        == 2.0
        == step_reward(2.0, 0, 1, step_rewards=False, gamma=0.5)
    )


def test_equal_prompts_give_equal_observation_keys_across_episodes():
    a = episode_samples(
        assemble_session([rec(0, [1, 2], [3])]),
        query_id="q",
        episode_id="q#0",
        reward=1,
        correct=True,
        env="E",
    )
    b = episode_samples(
        assemble_session([rec(0, [1, 2], [4])]),
        query_id="q",
        episode_id="q#1",
        reward=0,
        correct=False,
        env="E",
    )
    c = episode_samples(
        assemble_session([rec(0, [1, 3], [4])]),
        query_id="q",
        episode_id="q#2",
        reward=0,
        correct=False,
        env="E",
    )
    assert a[0].obs_key == b[0].obs_key != c[0].obs_key


def test_an_episode_without_a_call_is_refused_naming_query_and_env():
    with pytest.raises(
        EmptyEpisodeError, match=r"MyAgentEnv: the agent program made no model call on query 'q7'"
    ):
        episode_samples([], query_id="q7", episode_id="q7#0", reward=1.0, correct=True, env="MyAgentEnv")
    import pickle

    err = pickle.loads(pickle.dumps(EmptyEpisodeError("q", "E")))  # crosses process boundaries intact
    assert err.query_id == "q" and "E" in str(err)


def test_decode_gives_the_response_text_context_included():
    [s] = episode_samples(
        assemble_session([rec(0, [1], [2]), rec(1, [1, 2, 3], [4])]),
        query_id="q",
        episode_id="q#0",
        reward=1,
        correct=True,
        env="E",
        decode=lambda ids: ",".join(map(str, ids)),
    )
    assert s.response_text == "2,3,4"
