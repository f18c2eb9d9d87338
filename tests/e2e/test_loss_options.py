"""The loss options the unit tier tests through the learner's update, here in Ray runs: policy_loss 'clip_cov',
'sapo', 'kl_cov', 'gpg' and 'vespo' (a step off-policy), with top_entropy_quantile, mask_truncated_completions and
the KL term's 'abs' estimator in every case, and loss_agg_mode 'seq-mean-token-sum', advantage_estimator
'grpo_batch_std', sync_ref_model and use_kl_in_reward in the first, advantage_estimator 'remax' (a greedy response
per prompt as baseline, its mean reward logged) in the kl_cov one. The first case trains on two FSDP learners (gloo):
each rank builds the loss from the config it was shipped, takes the entropy quantile of its own micro-batches and
gathers the shards its copy of the reference moves toward, and the ranks report the same metric keys (the update's
metrics are reduced over them); the others, whose losses differ from it only in the learner's code, train on the
driver's learner: no learner actor to start, most of a case's cost. Each case trains two iterations with one runner:
its metrics are present and finite, its own ones nonzero, truncated responses were masked, the policy term had a
signal and the policy moved."""

from __future__ import annotations

import math

import pytest

from r3_rllib import R3Config
from r3_rllib.models import default_tiny_model_path

pytestmark = pytest.mark.slow

#: Every case: the policy loss on a third of each micro-batch's tokens (those of highest entropy), the truncated
#: responses out of the update, a KL term toward the reference with the |log ratio| estimator.
COMMON = dict(top_entropy_quantile=1 / 3, mask_truncated_completions=True, kl_coef=0.05, kl_type="abs")
#: case: (learners, options, the loss's own metrics).
CASES = {
    # Clip-Cov's band widened to every unclipped token of positive covariance, and half of them drawn: it drops some.
    "clip_cov": (
        2,
        dict(
            policy_loss="clip_cov",
            clip_cov_ratio=0.5,
            clip_cov_lb=0.0,
            clip_cov_ub=1e6,
            loss_agg_mode="seq-mean-token-sum",
            advantage_estimator="grpo_batch_std",
            # The reference follows the policy after every optimizer step (each rank gathers the shards it moves
            # its own copy with), and verl's in-reward KL: the learners score every row before the advantages.
            sync_ref_model=True,
            ref_model_sync_steps=1,
            use_kl_in_reward=True,
            kl_ctrl_type="adaptive",
        ),
        ("clip_cov_frac",),
    ),
    "sapo": (0, dict(policy_loss="sapo", loss_agg_mode="seq-mean-token-mean"), ()),  # SAPO's only mode
    # ReMax's baseline: the runner decodes one greedy response per prompt and grades it (rollout metric below).
    "kl_cov": (
        0,
        dict(policy_loss="kl_cov", kl_cov_ratio=0.5, advantage_estimator="remax"),
        ("kl_cov_frac",),
    ),
    "gpg": (0, dict(policy_loss="gpg"), ()),
    # VESPO folds the rollout weights into each response's weight and multiplies each token's term by the entropy
    # mask. A step off-policy (overlap) and two minibatches: the kernel sees weights away from 1 and scales the
    # steps by them.
    "vespo": (
        0,
        dict(
            policy_loss="vespo",
            off_policy_correction=True,
            overlap_generation=True,
            num_minibatches=2,
        ),
        ("vespo_phi_mean",),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_options_train_end_to_end(ray_session, case):
    """The shipped arithmetic model's responses to 2-digit sums hit max_new_tokens 3 about 2 times in 3
    (rollout/truncated_frac): those are masked, and the first iteration's groups differ in reward."""
    num_learners, options, own = CASES[case]
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 64, "seed": 0})
        .env_runners(num_env_runners=1)
        .learners(num_learners=num_learners, num_cpus_per_learner=1)
        .debugging(seed=0)
        .training(
            model_path=default_tiny_model_path(),
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=3,
            lr=1e-3,
            micro_batch_size=8,
            **(COMMON | options),
        )
    )
    algo = config.build_algo()
    try:
        before = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
        results = [algo.train() for _ in range(2)]
        after = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
    finally:
        algo.stop()
    learner = [r["learner"] for r in results]
    masks_entropy = (COMMON | options)["top_entropy_quantile"] < 1.0
    keys = ("loss", "pg_loss", "kl", "approx_kl", *own) + (("entropy_mask_frac",) if masks_entropy else ())
    values = [{k: m[k] for k in keys} for m in learner]
    assert all(math.isfinite(v) for m in values for v in m.values()), values
    if masks_entropy:  # a third of the trained tokens, or a token more (torch.quantile interpolates)
        assert all(0.3 <= m["entropy_mask_frac"] < 0.5 for m in values), values
    if options.get("policy_loss") == "vespo":
        # Off-policy rows at lr 1e-3: the kernel moved well off phi(1) = 1, within (0, its peak): e 4 / 9 at
        # w = 2/3 for A >= 0, e^2 1.5^3 e^-3 = 3.375 / e at w = 1.5 below.
        peak = max(4.0 * math.e / 9.0, 3.375 / math.e)
        assert all(0.0 < m["vespo_phi_mean"] <= peak for m in values), values
        assert any(abs(m["vespo_phi_mean"] - 1.0) > 0.05 for m in values), values
    assert all(any(m[k] > 0 for m in values) for k in own), values
    masked = [r["r3"]["truncated_masked"] for r in results]
    assert any(n > 0 for n in masked), masked
    assert any(m["pg_loss"] != 0.0 for m in values) and after != before, (values, before, after)
    if options.get("advantage_estimator") == "remax":
        greedy = [r["rollout"]["greedy_baseline_reward_mean"] for r in results]
        assert all(0.0 <= g <= 1.0 for g in greedy), greedy
    if options.get("sync_ref_model"):
        # One optimizer step per iteration (one minibatch, one epoch), a sync after each.
        assert [m["ref_model_syncs"] for m in learner] == [1.0, 2.0]
    if options.get("use_kl_in_reward"):
        penalty = [r["r3"]["reward_kl_penalty"] for r in results]
        # The first rows are scored before any update: the policy is the reference, KL exactly 0; then > 0.
        assert penalty[0] == 0.0 and math.isfinite(penalty[1]) and penalty[1] > 0, penalty
        # verl's adaptive step after the first batch: current_kl 0 is 100 % under target_kl, clipped at -0.2, over
        # the 32 rows scored (8 queries x 4) of horizon 10000: beta x (1 - 0.2 x 32 / 10000), float64 arithmetic.
        coefs = [r["r3"]["reward_kl_coef"] for r in results]
        assert coefs[0] == 0.001 and coefs[1] == pytest.approx(0.001 * (1 - 0.2 * 32 / 10000), rel=1e-12), (
            coefs
        )
