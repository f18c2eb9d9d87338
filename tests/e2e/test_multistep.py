"""Lockstep multi-step rollouts (r3_rllib/rollout/kinds/multi_step.py) with the HF engine and the gridworld."""

import numpy as np
import pytest

from r3_rllib.core.hgpo import hgpo_advantages_by_query
from r3_rllib.engines.base import Completion, SamplingParams
from r3_rllib.envs.gridworld import GridWorldEnv, solve
from r3_rllib.rollout.kinds.multi_step import episode_stats, rollout_multistep


class ScriptedEngine:
    """Answers every prompt with the next move of a fixed script per call (counts the calls)."""

    def __init__(self, script):
        self.script, self.calls, self.batch_sizes = list(script), 0, []

    def generate(self, prompt_ids, n, params):
        assert n == 1
        text = self.script[self.calls % len(self.script)]
        self.calls += 1
        self.batch_sizes.append(len(prompt_ids))
        return [
            [Completion(list(p), [5], np.array([-0.5]), np.array([0.1]), "stop", text=text)]
            for p in prompt_ids
        ]


class CharTok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_lockstep_one_call_per_step_and_returns():
    env = GridWorldEnv(num_queries=2, max_steps=5)
    moves = solve(env.layout(env.query_ids[0]))
    engine = ScriptedEngine(moves)
    recs = rollout_multistep(
        engine, CharTok(), env.episode, env.query_ids, 3, SamplingParams(max_new_tokens=4), gamma=0.5
    )
    # query 0 follows its expert path to the goal; query 1 gets the same moves and may or may not finish
    first = [r for r in recs if r.query_id == env.query_ids[0]]
    assert len(first) == 3 * len(moves)
    lengths = {}
    for r in recs:
        lengths[(r.query_id, r.traj_id)] = lengths.get((r.query_id, r.traj_id), 0) + 1
    assert engine.calls == max(lengths.values())  # one batched call per round
    assert engine.batch_sizes[0] == 6  # 2 queries x 3 trajectories in one call
    traj0 = [r for r in first if r.traj_id == 0]
    assert [r.step for r in traj0] == list(range(len(moves)))
    assert traj0[-1].terminated and traj0[-1].reward == 1.0
    n = len(moves)
    # Exact: rewards 0 and (at the goal) 1, gamma 0.5: every G_t = r_t + 0.5 G_{t+1} is a power of two, so each step
    # is exact in float.
    np.testing.assert_array_equal(
        [r.discounted_return for r in traj0], [0.5 ** (n - 1 - t) for t in range(n)]
    )
    assert traj0[0].obs_key == env.layout(env.query_ids[0]).observation(env.layout(env.query_ids[0]).start)
    assert traj0[0].prompt_ids == [ord(c) for c in traj0[0].obs_key + ":"]
    stats = episode_stats(first)
    assert stats["success_rate"] == 1.0 and stats["steps_to_goal"] == n


def test_max_steps_truncates():
    env = GridWorldEnv(num_queries=1, max_steps=10)
    engine = ScriptedEngine(["nonsense"])
    recs = rollout_multistep(engine, CharTok(), env.episode, env.query_ids, 2, SamplingParams(), max_steps=3)
    assert len(recs) == 6 and engine.calls == 3
    assert [r.truncated for r in recs] == [False, False, True] * 2
    assert all(r.discounted_return == 0.0 for r in recs)
    with pytest.raises(ValueError, match="group_size"):
        rollout_multistep(engine, CharTok(), env.episode, env.query_ids, 0, SamplingParams())


@pytest.mark.slow
def test_hf_engine_rollout_feeds_hgpo(tiny_random_model):
    import torch

    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.models.tiny import load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer(tiny_random_model)
    engine = HFEngine(tiny_random_model, tok)
    env = GridWorldEnv(num_queries=2, max_steps=4)
    params = SamplingParams(max_new_tokens=3, temperature=1.0, seed=0)
    recs = rollout_multistep(engine, tok, env.episode, env.query_ids, 4, params)
    assert {(r.query_id, r.traj_id) for r in recs} == {(q, g) for q in env.query_ids for g in range(4)}
    for r in recs:
        assert 1 <= len(r.response_ids) <= 3 and r.logprobs.shape == (len(r.response_ids),)
        assert np.all(r.logprobs <= 0) and tok.decode(r.prompt_ids).endswith(r.obs_key + ":")
    # a random model almost never names a move: every trajectory runs the 4-step horizon
    assert max(r.step for r in recs) <= 3
    adv = hgpo_advantages_by_query(
        [r.query_id for r in recs],
        setting="hgpo",
        obs_keys=[r.obs_key for r in recs],
        traj_ids=[r.traj_id for r in recs],
        step_indices=[r.step for r in recs],
        step_returns=[r.discounted_return for r in recs],
    )
    assert adv.shape == (len(recs),) and np.all(np.isfinite(adv))
