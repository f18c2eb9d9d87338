"""The gridworld warm start (r3_rllib/warmstart/gridworld.py): a partial policy that leaves HGPO room to learn.

One build (~30 s of single-threaded SFT) serves every check; the success ranges are the module docstring's measured
rates with slack for the smaller evaluation here.
"""

from collections import defaultdict
from pathlib import Path

import pytest

from r3_rllib.engines.base import SamplingParams
from r3_rllib.envs.gridworld import GridWorldEnv
from r3_rllib.rollout.kinds.multi_step import episode_stats, rollout_multistep
from r3_rllib.warmstart.cached import read_metadata
from r3_rllib.warmstart.gridworld import (
    WARM_START_METADATA,
    WARM_START_PRESET,
    build_warm_start,
    evaluate_gridworld,
)


def _two_histories(seen: set[tuple[int, tuple[int, ...]]]) -> bool:
    """Two different trajectories reached this observation with different prompts."""
    return any(t1 != t2 and p1 != p2 for t1, p1 in seen for t2, p2 in seen)


@pytest.fixture(scope="module")
def warm_start(gridworld_warm_start):
    import torch

    from r3_rllib.models.tiny import load_tiny

    torch.set_num_threads(1)
    path = Path(gridworld_warm_start)  # built once per session (tests/conftest.py)
    model, tok = load_tiny(path)
    return path, model, tok


def test_builder_writes_a_reusable_checkpoint(warm_start):
    path, _, _ = warm_start
    meta = read_metadata(path, WARM_START_METADATA)
    assert meta is not None and meta["config"]["preset"] == WARM_START_PRESET and meta["config"]["seed"] == 0
    logs = []
    assert build_warm_start(path, seed=0, log=logs.append) == path
    assert logs and "reusing" in logs[0]  # same config: no second training run


def test_greedy_success_leaves_room_to_learn(warm_start):
    _, model, tok = warm_start
    env = GridWorldEnv(preset=WARM_START_PRESET, split="test", num_queries=80)
    stats = evaluate_gridworld(model, tok, env)
    # measured 0.22 .. 0.24 on 200 layouts (module docstring), 0.225 on these 80; neither hopeless nor solved
    assert 0.1 <= stats["success_rate"] <= 0.5, stats


def test_sampled_groups_mix_success_and_share_cells_across_histories(warm_start):
    _, model, tok = warm_start
    from r3_rllib.engines.hf_engine import HFEngine

    env = GridWorldEnv(preset=WARM_START_PRESET, split="test", num_queries=24)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)
    recs = rollout_multistep(
        HFEngine(model, tok, max_batch_size=512), tok, env.episode, env.query_ids, 8, params
    )
    stats = episode_stats(recs)
    assert 0.2 <= stats["success_rate"] <= 0.65, stats  # measured 0.40 here, 0.46 .. 0.48 on 100 x 8
    # HGPO's context inconsistency: one observation (cell) of one layout reached by different trajectories whose
    # prompts (memory windows) differ.
    prompts = defaultdict(lambda: defaultdict(set))
    for r in recs:
        prompts[r.query_id][r.obs_key].add((r.traj_id, tuple(r.prompt_ids)))
    inconsistent = [
        q for q, by_key in prompts.items() if any(_two_histories(seen) for seen in by_key.values())
    ]
    assert len(inconsistent) >= len(env.query_ids) // 2, len(inconsistent)
    # and groups are mixed: some layouts have both a success and a failure among their 8 trajectories
    outcome = defaultdict(set)
    for r in recs:
        if r.terminated or r.truncated:
            outcome[r.query_id].add(r.terminated)
    assert sum(len(v) == 2 for v in outcome.values()) >= len(env.query_ids) // 3
