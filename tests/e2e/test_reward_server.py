"""The reward server in the real algorithm: the shipped tiny model on 2-digit sums, two EnvRunners, a
rule term (tests/plugins/reward_scorers.py's digits_rule, through the package's RuleScorer) and a "format first"
gate graded in the server's actor pool, with overlap and with streaming (max_staleness 2: graded when the batch is
taken, while the topped-up runners generate). The composed rewards reach the trained batch, the metrics are logged, and a
term that hangs for one iteration costs that iteration a timeout (its worker replaced), not the run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from r3_rllib import R3Config

pytestmark = pytest.mark.slow

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
# The hanging term's class is imported by name in the reward workers, as a run gets a user's module from
# PYTHONPATH (set before Ray starts).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGINS), os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(PLUGINS))

TIMEOUT_S = 4.0
#: The deadline of the iterations whose grading must succeed: it is real work (an actor call on a machine the
#: runners and the learner keep busy), so it gets minutes; TIMEOUT_S (the config's) is the hanging iteration's.
GRADING_TIMEOUT_S = 120.0


def _config(flag: Path, max_staleness: int) -> R3Config:
    rule = f"{PLUGINS / 'reward_scorers.py'}:digits_rule"
    terms = [
        {"name": "digits", "type": "rule", "function": rule, "weight": 0.5},
        {"name": "format", "type": "rule", "function": rule, "gate": True, "gate_reward": -1.0},
        {"name": "slow", "type": "judge", "weight": 0.0, "scorer_class": "reward_scorers:HangWhileFlagged"}
        | {"rubric": str(flag)},
    ]
    return (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 200})
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=3)
        .training(
            group_size=4,
            queries_per_iteration=4,
            max_new_tokens=4,
            temperature=1.0,
            micro_batch_size=32,
            eval_interval=0,
            max_staleness=max_staleness,
            reward_models=terms,
            reward_workers=1,
            reward_num_cpus_per_worker=0.5,
            reward_timeout_s=TIMEOUT_S,
        )
    )


def _keep_trained_batches(algo) -> list[list]:
    """The list every batch ``algo`` trains on is appended to (its learners' update, wrapped)."""
    batches, update = [], algo._update_learners

    def keep_batch(batch, phase=None):
        batches.append(list(batch))
        return update(batch, phase)

    algo._update_learners = keep_batch
    return batches


def _expected(sample) -> float:
    parts = sample.reward_parts
    if parts["format"] < 0.5:
        return -1.0
    return sample.env_reward + 0.5 * parts["digits"]


@pytest.mark.parametrize("max_staleness", [1, 2], ids=["overlap", "streaming"])
def test_composed_rewards_reach_the_batch_and_a_hanging_term_costs_a_timeout(
    ray_session, tmp_path, max_staleness
):
    flag = tmp_path / "hang"
    algo = _config(flag, max_staleness).build_algo()
    batches = _keep_trained_batches(algo)
    try:
        (server,) = algo.coordinator.stages
        assert server.timeout_s == TIMEOUT_S  # reward_timeout_s reached the server
        server.timeout_s = GRADING_TIMEOUT_S
        results = [algo.train() for _ in range(2)]
        flag.touch()  # the "slow" term hangs on the next rollout
        server.timeout_s = TIMEOUT_S
        results.append(algo.train())
        flag.unlink()
        server.timeout_s = GRADING_TIMEOUT_S
        results.append(algo.train())
    finally:
        algo.stop()  # stops the rollout stages too (R3.cleanup)
    servers = [r["reward_server"] for r in results]
    for i in (0, 1, 3):
        assert servers[i]["failures/timeout"] == 0.0 and servers[i]["slow_mean"] == 1.0
        # Iteration 3 first waits for the replacement of the worker killed at iteration 2: an actor start (seconds
        # on a loaded 2-core machine) that the timeout does not count, so neither does this bound.
        assert servers[i]["wait_s"] - servers[i]["worker_start_s"] < GRADING_TIMEOUT_S
    assert servers[0]["worker_start_s"] == servers[1]["worker_start_s"] == 0.0
    # 16 samples x 3 terms timed out; the iteration trained on what it had
    assert servers[2]["failures/timeout"] == 48.0 and servers[2]["wait_s"] >= TIMEOUT_S - 0.5
    assert all(0.0 <= s["digits_mean"] <= 1.0 and "reward_mean" in s and "grade_s" in s for s in servers)
    trained = [s for b in batches for s in b]
    assert trained, "no iteration trained"
    graded = [s for s in trained if s.grade_reason is None or ":" not in s.grade_reason]
    assert graded and all(s.reward == pytest.approx(_expected(s)) for s in graded)
    assert {"digits", "format", "slow", "correctness"} <= set(trained[0].reward_parts)
    timed_out = [s for s in trained if s.grade_reason == "digits:timeout"]
    # the gate's score is 0 when it timed out: its reward
    assert all(s.reward == -1.0 and s.reward_parts["slow"] == 0.0 for s in timed_out)
    assert all(r["rollout"]["policy_lag"] <= max_staleness for r in results)


def test_gdpo_normalises_the_env_reward_and_each_term_apart(ray_session):
    """advantage_estimator 'gdpo' (TRL's normalize_then_sum) on the server's composed samples of two runners: each
    trained response's advantage is its group's weighted sum of the env reward and the rule term's score, each
    normalised within the group on its own, whitened over the iteration's batch, recomputed here from the samples'
    env reward and reward parts; every group of a batch with some spread trains (the whitening moves an all-equal
    group off zero), and a batch without any trains nothing."""
    import math

    import numpy as np

    rule = f"{PLUGINS / 'reward_scorers.py'}:digits_rule"
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 200})
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=3)
        .training(
            advantage_estimator="gdpo",
            group_size=4,
            queries_per_iteration=4,
            max_new_tokens=4,
            micro_batch_size=32,
            reward_models=[{"name": "digits", "type": "rule", "function": rule, "weight": 0.5}],
            reward_workers=1,
            reward_num_cpus_per_worker=0.5,
            reward_timeout_s=GRADING_TIMEOUT_S,
        )
    )
    algo = config.build_algo()
    batches = _keep_trained_batches(algo)
    try:
        trained = [algo.train()["r3"]["train_samples"] for _ in range(4)]
    finally:
        algo.stop()
    # A batch trains whole or not at all: every group of it (16 samples), or none when no group had any spread
    # (every sum 0, so every whitened advantage 0, as in TRL).
    assert set(trained) <= {0.0, 16.0} and trained.count(16.0) == len(batches) >= 1, trained
    assert all(len(b) == 16 for b in batches)
    for batch in batches:
        sums = []
        for start in range(0, 16, 4):
            group = batch[start : start + 4]
            assert len({s.query_id for s in group}) == 1
            total = np.zeros(4)
            for weight, values in (
                (1.0, [s.env_reward for s in group]),
                (0.5, [s.reward_parts["digits"] for s in group]),
            ):
                v = np.asarray(values, dtype=np.float64)
                total += weight * (v - v.mean()) / (v.std(ddof=1) + 1e-4)
            sums.extend(total)
        sums = np.asarray(sums)
        expected = (sums - sums.mean()) / (sums.std(ddof=1) + 1e-4)
        assert [s.advantage for s in batch] == pytest.approx(expected.tolist(), rel=1e-9, abs=1e-12)
        assert not math.isclose(float(np.abs(expected).sum()), 0.0)
