"""R^3's replay on agent trajectories (pure, no Ray): samples assembled from a gateway session's call records (a
multi-call trajectory with its context tokens masked, and a step sample of a rewritten history) go through the
replay buffer (``Sample.to_replay`` -> ``QueryReplayBuffer.add`` -> ``sample_opposite`` -> ``Sample.from_replay``)
and come back with their tokens, loss masks, behaviour log-probs, reward and outcome, and the batch builder mixes
them into an all-wrong agent group of the same query."""

from __future__ import annotations

import numpy as np

from r3_rllib.algorithms.r3.groups import build_training_batch
from r3_rllib.core.iteration import IterationSettings
from r3_rllib.replay.buffer import QueryReplayBuffer, ReplayConfig
from r3_rllib.rollout.trajectories import assemble_session, episode_samples
from r3_rllib.types.calls import CallRecord
from r3_rllib.types.samples import Group, Sample


def rec(index, prompt, completion, *, version, base, finish="stop"):
    """A call record whose log-probs / entropies are distinct per token (``base`` + position / 10)."""
    n = len(completion)
    return CallRecord(
        session_id=f"s{index}",
        index=index,
        endpoint="chat",
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-(base + i / 10) for i in range(n)],
        entropies=[base + i / 10 + 0.05 for i in range(n)],
        token_versions=[version] * n if isinstance(version, int) else version,
        finish_reason=finish,
        text="".join(chr(97 + t % 26) for t in completion),
    )


def agent_episode(query_id, episode_id, *, reward, correct, offset=0):
    """One agent episode's samples: a two-call trajectory (the second call's prompt extends the first call's
    context by a tool reply, masked) and a step sample whose prompt rewrote the history. ``offset`` shifts the
    model's tokens so episodes differ."""
    o = offset
    records = [
        rec(0, [1, 2, 3], [10 + o, 11 + o], version=3, base=1.0),
        rec(1, [1, 2, 3, 10 + o, 11 + o, 20, 21], [30 + o, 31 + o], version=[4, 5], base=2.0),
        rec(2, [7, 8], [40 + o, 41 + o, 42 + o], version=5, base=3.0, finish="length"),
    ]
    return episode_samples(
        assemble_session(records),
        query_id=query_id,
        episode_id=episode_id,
        reward=reward,
        correct=correct,
        env="agent",
    )


def round_trip(samples, *, want_correct, k, current_version):
    """``samples`` stored in a fresh replay buffer and drawn back as training samples."""
    buffer = QueryReplayBuffer(ReplayConfig(max_age=None, seed=0))
    assert buffer.add(s.to_replay() for s in samples) == len(samples)
    drawn = buffer.sample_opposite(
        samples[0].query_id, want_correct=want_correct, k=k, current_version=current_version
    )
    return [Sample.from_replay(s) for s in drawn]


def by_prompt(samples):
    return {tuple(s.prompt_ids): s for s in samples}


def test_agent_samples_come_back_from_the_replay_buffer_intact():
    fresh = agent_episode("q", "q#0", reward=1.0, correct=True)
    assert [s.step_index for s in fresh] == [0, 1]  # the trajectory and the rewritten history's step sample
    assert fresh[0].loss_mask.tolist() == [True, True, False, False, True, True]
    np.testing.assert_array_equal(fresh[0].token_versions, [3, 3, 3, 3, 4, 5])
    back = round_trip(fresh, want_correct=True, k=4, current_version=6)
    assert len(back) == 2  # both of the episode's samples, the step sample included
    replayed = by_prompt(back)
    for s in fresh:
        r = replayed[tuple(s.prompt_ids)]
        assert r.is_replay and r.query_id == "q"
        assert r.response_ids == s.response_ids
        np.testing.assert_array_equal(r.loss_mask, s.loss_mask)
        np.testing.assert_array_equal(r.behavior_logprobs, s.behavior_logprobs)
        assert r.behavior_logprobs.dtype == np.float32
        assert (r.reward, r.correct, r.truncated) == (s.reward, s.correct, s.truncated)
        assert r.policy_version == s.policy_version  # the oldest version of the model's tokens
        assert r.response_text == s.response_text
    # Context (tool) tokens keep a zero log-prob and a False mask: the learner neither trains nor weights them.
    first = replayed[(1, 2, 3)]
    assert first.policy_version == 3 and not first.truncated
    np.testing.assert_array_equal(first.behavior_logprobs[~first.loss_mask], [0.0, 0.0])
    assert replayed[(7, 8)].truncated and replayed[(7, 8)].loss_mask.all()


def test_an_all_wrong_agent_group_is_mixed_with_replayed_agent_successes():
    past = agent_episode("q", "q#old", reward=1.0, correct=True)
    buffer = QueryReplayBuffer(ReplayConfig(max_age=None, seed=0))
    buffer.add(s.to_replay() for s in past)
    # This iteration's group of the query: two agent episodes, both wrong (each a trajectory and a step sample).
    wrong = [
        s
        for i in range(2)
        for s in agent_episode("q", f"q#{i}", reward=0.0, correct=False, offset=100 + 10 * i)
    ]
    group = Group("q", wrong)
    assert group.all_wrong

    def fetch_replay(requests):
        assert requests == [("q", True, 2)]  # the all-wrong group asks for successes
        got = buffer.sample_batch([(qid, want, k, 6) for qid, want, k in requests])
        return [[Sample.from_replay(s) for s in samples] for samples in got]

    settings = IterationSettings(
        replay=True, replay_k=2, advantage_estimator="mixed", advantage_params={"alpha": 1.0, "lam": 0.0}
    )
    batch, metrics = build_training_batch([group], settings, fetch_replay)
    assert metrics["zero_adv_frac_before"] == 1.0 and metrics["zero_adv_frac"] == 0.0
    assert metrics["replay_hits"] == 1 and metrics["replay_samples"] == 2  # one group revived, by two samples
    assert [s.is_replay for s in batch] == [False] * 4 + [True] * 2
    # G_mix rewards [0, 0, 0, 0, 1, 1]: mean 1/3, population std sqrt(2)/3.
    std = np.sqrt(2) / 3
    np.testing.assert_allclose([s.advantage for s in batch[:4]], [-(1 / 3) / std] * 4)
    np.testing.assert_allclose([s.advantage for s in batch[4:]], [(2 / 3) / std] * 2)
    # The replayed members are the stored agent samples: tokens, masks and log-probs as they were sampled.
    replayed = by_prompt(batch[4:])
    for s in past:
        r = replayed[tuple(s.prompt_ids)]
        assert r.response_ids == s.response_ids and r.correct and r.reward == 1.0
        np.testing.assert_array_equal(r.loss_mask, s.loss_mask)
        np.testing.assert_array_equal(r.behavior_logprobs, s.behavior_logprobs)
    # The fresh members keep their masks and per-token versions.
    np.testing.assert_array_equal(batch[0].loss_mask, wrong[0].loss_mask)
    np.testing.assert_array_equal(batch[0].token_versions, [3, 3, 3, 3, 4, 5])
