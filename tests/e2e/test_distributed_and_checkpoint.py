"""Two learner workers (FSDP2, or replicated with averaged gradients) match one worker; checkpoints restore in a new
process and continue."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from r3_rllib import R3Config

pytestmark = pytest.mark.slow
HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
from algo_checks import checkpoint_fingerprint  # noqa: E402
from numeric import EPS32, GRAD_ULPS, f32_tol, forward_atol  # noqa: E402
from resume_child import LR_SCHEDULE, make_config  # noqa: E402

GROUP_SIZE = 4


def abs_param_sum(algo) -> float:
    """Sum of |parameter| of a local learner's policy: the scale of its parameter checksum's rounding."""
    return algo.learner_call(
        lambda lr: sum(float(p.detach().double().abs().sum()) for p in lr.policy.parameters())
    )[0]


def _exact_state(algo) -> dict[str, float]:
    """The whole (gathered) parameters' and AdamW moments' sums, each with math.fsum: exactly rounded, so equal to
    the last bit for the same tensors however they are sharded or ordered; and the policy version. Every rank
    computes it (gathering a sharded tensor is collective); rank 0's is returned."""

    def exact(
        learner,
    ) -> dict[str, float]:  # nested: Ray pickles it by value (the learners cannot import tests/)
        import math

        from torch.distributed.tensor import DTensor

        def entries(tensors) -> list[float]:
            whole = [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors]
            return [x for t in whole for x in t.detach().double().flatten().tolist()]

        moments = [s[k] for s in learner._optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
        return {
            "params": math.fsum(entries(learner.policy.parameters())),
            "moments": math.fsum(entries(moments)),
            "version": learner.policy_state.version,
        }

    return algo.learner_call(exact)[0]


def _trajectory(
    model_path: str,
    num_learners: int,
    iterations: int = 2,
    save_to: str | None = None,
    restore_from: str | None = None,
    **training,
) -> list[dict]:
    """Each iteration's learner metrics, then the parameter checksums; with `save_to`, the run's final checkpoint
    and exact state; with `restore_from`, the exact state after restoring that checkpoint at the end."""
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"num_queries": 64})
        .env_runners(num_env_runners=1)
        .learners(num_learners=num_learners, num_cpus_per_learner=1)
        # Ranking rewards give a random policy non-zero advantages, so every iteration trains.
        .r3(ranking=True, ranking_start_epoch=0)
        .training(
            model_path=model_path,
            group_size=GROUP_SIZE,
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
        vocab = algo.learner_call(lambda lr: lr.policy.config.vocab_size)[0]
        scale = abs_param_sum(algo) if num_learners == 0 else None  # the one-learner run gives the scale
        out.append({"params": per_rank[0], "per_rank": per_rank, "abs_params": scale, "vocab": vocab})
        if save_to is not None:
            out[-1]["checkpoint"] = algo.save(save_to).checkpoint.path
            out[-1]["exact"] = _exact_state(algo)
        if restore_from is not None:
            algo.restore(restore_from)
            out[-1]["restored"] = _exact_state(algo)
        return out
    finally:
        algo.stop()


def _assert_same_trajectory(one: list[dict], two: list[dict]) -> None:
    """Two learners' iterations are one learner's to float rounding. Each metric is the same quantity computed from
    the same samples in other micro-batch shapes, shards and sum orders (tolerances from tests/numeric.py):

    - loss: a token mean of -A * r, |A| <= sqrt(G - 1) (z-scored group advantages, Samuelson's inequality), r = 1 in
      the first minibatch and near it after (the clip range is 0.2): GRAD_ULPS float32 ulps of 2 sqrt(G - 1) (~4e-4),
      the unit tier's allowance for a loss summed in other micro-batches;
    - grad_norm: each gradient entry within GRAD_ULPS ulps of the largest, so the norm to GRAD_ULPS ulps of itself;
    - entropy: a token mean of entropies <= log V, a forward pass: forward_atol(log V) (~1.4e-4);
    - the parameter checksum (a float64 sum of every float32 parameter): the same AdamW steps from the same start,
      each entry rounded otherwise by a few ulps of itself: 8 float32 ulps of sum |theta| (~1.3e-2 on the tiny
      model's ~1.4e4). An entry whose gradient is within its rounding of zero could take its sign-like first Adam
      step the other way (2 lr = 6e-3): the bound leaves room for two of those.
    The parameters then differ by ulps, so the second iteration's metrics keep the first one's tolerances.

    The bugs they catch move them by far more: a normaliser off by 2 doubles grad_norm (~2 here) and the loss (0.002
    and 0.026 in the two iterations); a rank training on the wrong rows turns the sign-like Adam steps of many
    entries (lr each), moving the checksum by O(1)."""
    last = one[-1]
    loss_tol = f32_tol(2 * math.sqrt(GROUP_SIZE - 1), GRAD_ULPS)
    entropy_tol = forward_atol(math.log(last["vocab"]))
    for a, b in zip(one[:-1], two[:-1], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=0, abs=loss_tol), (one, two)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=GRAD_ULPS * EPS32, abs=0), (one, two)
        assert b["entropy"] == pytest.approx(a["entropy"], rel=0, abs=entropy_tol), (one, two)
    assert two[-1]["params"] == pytest.approx(last["params"], rel=0, abs=f32_tol(last["abs_params"], 8))


@pytest.fixture(scope="module")
def one_learner(ray_session, tiny_random_model, tmp_path_factory) -> list[dict]:
    """The trajectory of one learner, computed once for the tests that compare several learners with it, and its
    final checkpoint."""
    return _trajectory(tiny_random_model, 0, save_to=str(tmp_path_factory.mktemp("one_learner") / "ckpt"))


def test_two_fsdp_learners_match_one(one_learner, tiny_random_model):
    one = one_learner
    two = _trajectory(tiny_random_model, 2, restore_from=one[-1]["checkpoint"])
    _assert_same_trajectory(one, two)
    # The one learner's checkpoint restored into two sharded learners (DCP reshards; the second rank takes rank 0's
    # RNG state): the same tensors to the last bit. Before, the second learner found no rank1_extra.pt and the
    # restore failed as a corrupt checkpoint.
    assert two[-1]["restored"] == one[-1]["exact"]
    # Token-budget micro-batches: each rank packs its own samples (1-2 of ~10-15 tokens per pass), so the ranks
    # may run different numbers of passes; the gradient is the same because losses use global normalisers. The
    # passes have other shapes than above: other float rounding, within the same tolerances.
    budget = _trajectory(tiny_random_model, 2, micro_batch_max_tokens=24)
    _assert_same_trajectory(one, budget)


def test_two_replicated_learners_match_one(one_learner, tiny_random_model):
    # fsdp=False: each learner holds the whole policy and the gradients are averaged once per optimizer step. With
    # the token budget the ranks may run different numbers of passes (as above), which a per-backward all-reduce
    # (DDP) would not survive. Without the averaging each rank trained its own policy (3e-3 apart after 2 steps).
    two = _trajectory(tiny_random_model, 2, fsdp=False, micro_batch_max_tokens=24)
    _assert_same_trajectory(one_learner, two)
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
    _assert_same_trajectory(one, two)


def test_checkpoint_restores_in_new_process_and_continues(ray_session, tiny_random_model, tmp_path):
    from r3_rllib.core.schedules import scheduled_value

    algo = make_config(tiny_random_model).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        # Each update trains at the schedule's value at the samples of the batches before it.
        samples = [0.0] + [r["num_env_steps_sampled_lifetime"] for r in results]
        assert 0 < samples[1] < samples[2] < LR_SCHEDULE[-1][0]
        assert [r["learner"]["lr"] for r in results] == [scheduled_value(LR_SCHEDULE, n) for n in samples[:2]]
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        saved = checkpoint_fingerprint(algo)
    finally:
        algo.stop()
    assert saved["optim"] != 0.0 and saved["replay_size"] > 0
    env = {**os.environ, "PYTHONPATH": HERE}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "resume_child.py"), checkpoint],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    child = json.loads(lines[-1][len("RESULT ") :])
    assert child["iteration"] == 2 and child["next_iteration"] == 3
    # Rebuilt from the checkpoint alone (R3.from_checkpoint: the config saved in it), the run's settings came back.
    assert child["config"] == {
        "lr": LR_SCHEDULE,
        "env_config": {"num_queries": 16},
        "model_path": tiny_random_model,
    }
    # Exact: the restore copies the tensors' bits, both processes sum them with the same code on one torch thread
    # (the learner's num_cpus_per_learner; algo_checks.checkpoint_fingerprint), and JSON carries a float's repr,
    # which reads back to the same float.
    assert child["params"] == saved["params"]
    assert child["optim"] == saved["optim"]
    assert child["replay_size"] == saved["replay_size"]
    assert child["policy_version"] == 3.0  # two updates before the save, one after
    assert child["lr"] == scheduled_value(LR_SCHEDULE, samples[2])  # the samples so far came back with it


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
    assert want["mismatch_seq_masked_frac"] == 0.5  # 4 of 8 sequences: exact
    group = config.learners(num_learners=2, num_cpus_per_learner=1).build_learner_group(
        env=None, spaces=spaces
    )
    try:
        ref = ray.put(batch)
        got = [r.get() for r in group.foreach_learner(lambda lr, _b=ref: lr.update_from_samples(_b, seed=0))]
        sums = [r.get() for r in group.foreach_learner(lambda lr: lr.parameter_checksum())]
    finally:
        group.shutdown()
    # One update of the same rows in other shards (tests/numeric.py): the loss, a token mean of -A * r (r = 1: one
    # step), to GRAD_ULPS ulps of the largest advantage; grad_norm to GRAD_ULPS ulps of itself; the parameters,
    # one AdamW step from the same start, to 8 ulps of sum |theta| (see _assert_same_trajectory). A normaliser off
    # by the kept share (1/2) moves the loss (~0.23) and grad_norm (~9) by half, far above these.
    adv_scale = max(abs(float(s.advantage)) for s in samples)
    for metrics in got:
        # The ranks' counts of rejected sequences, reduced: 4 of 8, exact.
        assert metrics["mismatch_seq_masked_frac"] == 0.5
        assert metrics["loss"] == pytest.approx(want["loss"], rel=0, abs=f32_tol(adv_scale, GRAD_ULPS))
        assert metrics["grad_norm"] == pytest.approx(want["grad_norm"], rel=GRAD_ULPS * EPS32, abs=0)
    abs_params = sum(float(p.detach().double().abs().sum()) for p in one.policy.parameters())
    assert sums[0] == pytest.approx(one.parameter_checksum(), rel=0, abs=f32_tol(abs_params, 8))
