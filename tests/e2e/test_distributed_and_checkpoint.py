"""Two learner workers (FSDP2, or replicated with averaged gradients) match one worker; checkpoints restore in a new
process and continue."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from r3_rllib import R3Config

pytestmark = pytest.mark.slow
HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
from algo_checks import checkpoint_fingerprint  # noqa: E402
from resume_child import make_config  # noqa: E402


def _trajectory(model_path: str, num_learners: int, iterations: int = 2, **training) -> list[dict]:
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"num_queries": 64})
        .env_runners(num_env_runners=1)
        .learners(num_learners=num_learners, num_cpus_per_learner=1)
        # Ranking rewards give a random policy non-zero advantages, so every iteration trains.
        .r3(ranking=True, ranking_start_epoch=0)
        .training(
            model_path=model_path,
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=5,
            lr=3e-3,
            num_minibatches=2,
            micro_batch_size=4,
        )
        .training(**training)
    )
    algo = config.build_algo()
    try:
        out = []
        for _ in range(iterations):
            r = algo.train()
            out.append({k: float(r["learner"][k]) for k in ("loss", "grad_norm", "entropy")})
        per_rank = algo.learner_call(lambda lr: lr.parameter_checksum())
        out.append({"params": per_rank[0], "per_rank": per_rank})
        return out
    finally:
        algo.stop()


def _assert_same_trajectory(
    one: list[dict], two: list[dict], rel: float = 1e-4, abs_: float = 1e-6, params_rel: float = 1e-5
) -> None:
    for a, b in zip(one[:-1], two[:-1], strict=True):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=rel, abs=abs_), (key, one, two)
    assert two[-1]["params"] == pytest.approx(one[-1]["params"], rel=params_rel)


@pytest.fixture(scope="module")
def one_learner(ray_session, tiny_random_model) -> list[dict]:
    """The trajectory of one learner, computed once for the tests that compare several learners with it."""
    return _trajectory(tiny_random_model, 0)


def test_two_fsdp_learners_match_one(one_learner, tiny_random_model):
    one = one_learner
    _assert_same_trajectory(one, _trajectory(tiny_random_model, 2))
    # Token-budget micro-batches: each rank packs its own samples (1-2 of ~10-15 tokens per pass), so the ranks
    # may run different numbers of passes; the gradient is the same because losses use global normalisers. The
    # passes have other shapes than above, so float rounding differs, and Adam turns it into parameter differences
    # on near-zero gradients (a few 1e-6 on the loss here, printed on failure): hence the wider tolerance.
    budget = _trajectory(tiny_random_model, 2, micro_batch_max_tokens=24)
    _assert_same_trajectory(one, budget, rel=2e-4, abs_=2e-5, params_rel=3e-5)


def test_two_replicated_learners_match_one(one_learner, tiny_random_model):
    # fsdp=False: each learner holds the whole policy and the gradients are averaged once per optimizer step. With
    # the token budget the ranks may run different numbers of passes (as above), which a per-backward all-reduce
    # (DDP) would not survive. Without the averaging each rank trained its own policy (3e-3 apart after 2 steps).
    two = _trajectory(tiny_random_model, 2, fsdp=False, micro_batch_max_tokens=24)
    _assert_same_trajectory(one_learner, two, rel=2e-4, abs_=2e-5, params_rel=3e-5)
    # Every rank applied the same update to the same start: the copies are equal to the last bit.
    assert two[-1]["per_rank"][0] == two[-1]["per_rank"][1], two[-1]


def test_two_fsdp_learners_with_lora_match_one(ray_session, tiny_random_model):
    """LoRA (peft) under FSDP2: the adapter trained by two sharded learners is the one learner's, the KL reference
    pass (the base with the adapter off) runs inside the sharded model, and rank 0 gathers the adapter for the
    runner (the runner's sampling and the trained adapter then agree, or the second iteration's losses would not)."""
    pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    lora = dict(lora_rank=4, lora_alpha=8.0, kl_coef=0.1)
    one = _trajectory(tiny_random_model, 0, **lora)
    two = _trajectory(tiny_random_model, 2, **lora)
    _assert_same_trajectory(one, two, rel=2e-4, abs_=2e-5, params_rel=3e-5)


def test_checkpoint_restores_in_new_process_and_continues(ray_session, tiny_random_model, tmp_path):
    algo = make_config(tiny_random_model).build_algo()
    try:
        for _ in range(2):
            algo.train()
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        saved = checkpoint_fingerprint(algo)
    finally:
        algo.stop()
    assert saved["optim"] != 0.0 and saved["replay_size"] > 0
    env = {**os.environ, "PYTHONPATH": HERE}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "resume_child.py"), tiny_random_model, checkpoint],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    child = json.loads(lines[-1][len("RESULT ") :])
    assert child["iteration"] == 2 and child["next_iteration"] == 3
    assert child["params"] == pytest.approx(saved["params"], rel=1e-9)
    assert child["optim"] == pytest.approx(saved["optim"], rel=1e-9)
    assert child["replay_size"] == saved["replay_size"]
    assert child["policy_version"] == 3.0  # two updates before the save, one after


def test_two_fsdp_learners_reject_like_one(ray_session, tiny_random_model):
    """Sequence rejection across ranks: half the sequences carry behaviour log-probs 3 nats below the trainer's
    (ratio e^3 per token, outside [1/2, 2]) and leave the loss and its normaliser; the kept share each rank sees is
    its own, so the minibatch's rescale must use the rank-reduced one for two sharded learners to match one."""
    import gymnasium as gym
    import numpy as np
    import ray
    import torch
    from random_samples import random_samples

    from r3_rllib.algorithms.r3.rl_module import pack_samples
    from r3_rllib.types import TrainingBatch

    space = gym.spaces.Text(8)
    spaces = {"__env__": (space, space), "default_policy": (space, space)}
    config = (
        R3Config.grpo_preset()
        .learners(num_learners=0)
        .training(model_path=tiny_random_model, lr=1e-2, micro_batch_size=2, rollout_rs="sequence")
    )
    one = config.build_learner(env=None, spaces=spaces)
    samples = random_samples(8, min_response_len=2, num_queries=4)
    packed = pack_samples(samples, one._pad_id, "cpu")
    with torch.no_grad():
        lp, _ = one._score(one.policy, packed)
    for i, s in enumerate(samples):  # rows 0, 1, 4, 5 on-policy; 2, 3, 6, 7 rejected (both advantage signs)
        s.behavior_logprobs = lp[i][packed["response_mask"][i]].numpy().astype(np.float32) - 3.0 * (
            i // 2 % 2
        )
    batch = TrainingBatch.from_samples(samples)
    want = one.update_from_samples(batch, seed=0)
    assert want["mismatch_seq_masked_frac"] == pytest.approx(0.5)
    group = config.learners(num_learners=2, num_cpus_per_learner=1).build_learner_group(
        env=None, spaces=spaces
    )
    try:
        ref = ray.put(batch)
        got = [r.get() for r in group.foreach_learner(lambda lr, _b=ref: lr.update_from_samples(_b, seed=0))]
        sums = [r.get() for r in group.foreach_learner(lambda lr: lr.parameter_checksum())]
    finally:
        group.shutdown()
    for metrics in got:
        assert metrics["mismatch_seq_masked_frac"] == pytest.approx(0.5)
        assert metrics["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
        assert metrics["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    assert sums[0] == pytest.approx(one.parameter_checksum(), rel=1e-6)
