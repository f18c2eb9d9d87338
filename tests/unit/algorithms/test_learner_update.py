"""The learner's PPO epochs in one process (num_learners=0): the proximal ("old") log-probs of the first minibatch
come from its own training forward, not from a separate no-grad pass, and the update is the one a full recompute
gives."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, f32_tol, forward_atol
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.core.batching import minibatch_plan
from r3_rllib.models.rollout_head import get_rollout_head
from r3_rllib.r2po.method import R2POPhase
from r3_rllib.r2po.stages import BASE_STAGE, HEAD_STAGE
from r3_rllib.types import TrainingBatch
from r3_rllib.types.samples import Sample

torch.set_num_threads(TORCH_THREADS)


#: Every policy loss the config accepts, with an aggregation it allows.
POLICY_LOSSES = [
    ("clipped_pg", "token-mean"),
    ("gspo", "seq-mean-token-mean"),
    ("gspo", "seq-mean-token-sum"),  # LUSPO
    ("gspo_token", "seq-mean-token-mean"),
    ("cispo", "token-mean"),
    ("gpg", "token-mean"),
    ("sapo", "seq-mean-token-mean"),
    ("vespo", "token-mean"),
    ("kl_cov", "token-mean"),
    ("clip_cov", "token-mean"),
]


def _learner(model_path: str, **training) -> R3Learner:
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(
            model_path=model_path,
            micro_batch_size=3,
            gradient_checkpointing=False,
            # lr 1e-2 unless given: large steps, a wrong proximal policy in a later minibatch changes the result visibly
            **{"lr": 1e-2, **training},
        )
    )
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def _samples(n: int, seed: int = 0) -> list[Sample]:
    return random_samples(n, seed)


def _params(learner: R3Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.policy.parameters()]


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_first_minibatch_reuses_its_training_forward_and_the_update_matches_a_full_recompute(
    tiny_random_model, kl_coef
):
    samples = _samples(12)
    settings = dict(num_minibatches=3, num_epochs=2, kl_coef=kl_coef)

    ours = _learner(tiny_random_model, **settings)
    recomputed_rows: list[int] = []
    recompute = ours._recompute_old_logprobs

    def counted(batch, plan):
        recomputed_rows.extend(int(i) for mb in plan for i in mb)
        return recompute(batch, plan)

    ours._recompute_old_logprobs = counted
    ours.update_from_samples(TrainingBatch.from_samples(samples), seed=7)

    # The reference: every minibatch's old (and KL reference) log-probs from one no-grad pass before any step.
    reference = _learner(tiny_random_model, **settings)
    full_plan = minibatch_plan(len(samples), 3, 7)
    reference_recompute = reference._recompute_old_logprobs
    reference._recompute_old_logprobs = lambda batch, plan: reference_recompute(batch, full_plan)
    reference.update_from_samples(TrainingBatch.from_samples(samples), seed=7)

    assert sorted(recomputed_rows) == sorted(int(i) for mb in full_plan[1:] for i in mb)
    for a, b in zip(_params(ours), _params(reference), strict=True):
        # Exact: both learners score the same micro-batches (same shapes, same order) through the same kernels, with
        # or without autograd, so the proximal log-probs and every step after are bit-identical by construction
        # (checked under ATEN_CPU_CAPABILITY default/avx2/avx512 and 1 or 2 threads); lr 1e-2 Adam steps would turn
        # any rounding difference into visible ones.
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # A proximal policy taken after the first step would change the update (the check above can fail).
    stale = _learner(tiny_random_model, **settings)
    stale._recompute_old_logprobs = lambda batch, plan: ({}, {}) if kl_coef == 0.0 else ({}, None)
    stale.update_from_samples(TrainingBatch.from_samples(samples), seed=7)
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(_params(stale), _params(reference), strict=True))


def test_a_single_optimizer_step_recomputes_nothing(tiny_random_model):
    learner = _learner(tiny_random_model, num_minibatches=1, num_epochs=1)
    learner._recompute_old_logprobs = lambda *a: pytest.fail("no recompute expected")
    metrics = learner.update_from_samples(TrainingBatch.from_samples(_samples(6)), seed=0)
    assert metrics["optimizer_steps"] == 1.0


def test_r2po_stage_a_loss_is_the_policy_term_plus_beta_k3_to_the_current_base_as_an_option(
    tiny_random_model,
):
    from r3_rllib.algorithms.r3.rl_module import pack_samples
    from r3_rllib.models.rollout_head import rollout_token_logprobs

    beta = 0.04
    learner = _learner(
        tiny_random_model,
        rollout_head=True,
        rollout_head_kl_coef=beta,
        rollout_head_kl_target="current",  # ours: the current base, from the training forward
        rollout_head_kl_agg_mode="loss_agg_mode",  # ours: aggregated as the policy term
        num_minibatches=1,
        num_epochs=1,
        loss_agg_mode="token-mean",  # two micro-batches of 3: their metrics add up to the token means below
        is_cap=2.0,
        off_policy_correction=True,
    )
    assert learner._reference.model is None  # no KL term toward a reference model: no second model held
    _perturb_head(learner)
    samples = _samples(6)
    packed = pack_samples(samples, learner._pad_id, "cpu")
    m = packed["response_mask"]
    with torch.no_grad():
        roll, base = rollout_token_logprobs(
            learner.policy,
            packed["input_ids"],
            packed["attention_mask"],
            m,
            temperature=learner._temperature,
        )
    # By hand. One optimizer step: the proximal policy is the current one (ratio 1, no clipping), so each token's
    # policy term is -A * min(exp(roll - behaviour), cap); k3 = exp(d) - d - 1 with d = base - roll.
    adv = packed["advantages"][:, None]
    w = torch.clamp(torch.exp(roll - packed["behavior_logprobs"]), max=2.0)
    pg = (-adv * w)[m].mean().item()
    d = (base - roll)[m]
    assert 1e-3 < d.abs().max() < 2.5  # a visible gap, inside k3's unclamped range
    k3 = (torch.exp(d) - d - 1).mean().item()

    # The learner scores micro-batches of 3, the hand values one batch of 6: each log-prob may differ by
    # forward_atol (tests/numeric.py: FORWARD_ULPS of their scale). Carried through the terms' derivatives:
    # d(A w)/d lp = A w (w = 2 where clamped: no dependence) and d k3 / d d = e^d - 1 (d is a difference of two).
    lp_tol = forward_atol(roll[m], base[m])
    pg_tol = lp_tol * float((adv.abs() * w)[m].max())
    k3_tol = 2 * lp_tol * float((torch.exp(d) - 1).abs().max())
    metrics = learner.update_from_samples(
        TrainingBatch.from_samples(samples), seed=0, phase=R2POPhase(HEAD_STAGE)
    )
    assert metrics["pg_loss"] == pytest.approx(pg, abs=pg_tol)
    assert metrics["r2po_kl"] == pytest.approx(k3, abs=k3_tol)
    assert metrics["loss"] == pytest.approx(pg + beta * k3, abs=pg_tol + beta * k3_tol)
    assert metrics["kl"] == 0.0  # no KL to the reference model in stage A
    # Stage B trains the base: no head KL term.
    assert (
        learner.update_from_samples(TrainingBatch.from_samples(samples), seed=0, phase=R2POPhase(BASE_STAGE))[
            "r2po_kl"
        ]
        == 0.0
    )


def _perturb_head(learner: R3Learner) -> None:
    """Move the head far from its ~0 init: head-on and head-off log-probs then differ visibly."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in get_rollout_head(learner.policy).parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def test_r2po_stage_a_kl_is_k3_to_the_initial_model_seq_mean_token_mean_by_default(tiny_random_model):
    from transformers import AutoModelForCausalLM

    from r3_rllib.algorithms.r3.rl_module import pack_samples
    from r3_rllib.core.logprobs import token_logprobs
    from r3_rllib.models.rollout_head import rollout_token_logprobs

    # Defaults: rollout_head_kl_target='initial', rollout_head_kl_agg_mode='seq-mean-token-mean' (the reference
    # code's), here beside a token-mean policy term split over two micro-batches of 3 rows.
    learner = _learner(tiny_random_model, rollout_head=True, num_minibatches=1, num_epochs=1)
    assert learner.config.loss_agg_mode == "token-mean" and learner._reference.model is not None
    _perturb_head(learner)
    samples = _samples(6)
    learner.update_from_samples(
        TrainingBatch.from_samples(samples), seed=0, phase=R2POPhase(BASE_STAGE)
    )  # one lr 1e-2 step on the base: it leaves the initial
    packed = pack_samples(samples, learner._pad_id, "cpu")
    ids, attn, m = packed["input_ids"], packed["attention_mask"], packed["response_mask"]
    initial = AutoModelForCausalLM.from_pretrained(tiny_random_model, dtype=torch.float32).eval()
    with torch.no_grad():
        roll, base = rollout_token_logprobs(learner.policy, ids, attn, m, temperature=learner._temperature)
        init, _ = token_logprobs(initial, ids, attn, response_mask=m, temperature=learner._temperature)
    assert (base - init)[m].abs().max() > 1e-2  # the current base is not the initial model any more

    # By hand: k3 = exp(d) - d - 1 with d = init - roll per token; each row's mean over its tokens, then the mean
    # over the 6 rows (responses of 1-4 tokens: not the token mean).
    mf = m.float()

    def k3(d: torch.Tensor) -> torch.Tensor:
        return torch.exp(d) - d - 1

    per_row = (k3(init - roll) * mf).sum(1) / mf.sum(1)
    expected = per_row.mean().item()
    lens = mf.sum(1).tolist()
    assert len(set(lens)) > 1, lens
    # Each log-prob may differ from the learner's by forward_atol (tests/numeric.py: FORWARD_ULPS of their scale;
    # the learner scores micro-batches of 3, the hand values one batch of 6); d is a difference of two, and
    # d k3 / d d = e^d - 1. Means do not grow the error; the micro-batches' weighted sum adds a few float32
    # roundings of the largest k3 (16 ulps).
    d = (init - roll)[m]
    tol = 2 * forward_atol(roll[m], init[m]) * float((torch.exp(d) - 1).abs().max())
    tol += f32_tol(float(k3(d).max()), 16)
    token_mean = k3(d).mean().item()
    to_current = ((k3(base - roll) * mf).sum(1) / mf.sum(1)).mean().item()
    # The test can fail: the token mean and the KL to the current base are other numbers.
    assert abs(expected - token_mean) > 10 * tol and abs(expected - to_current) > 10 * tol

    metrics = learner.update_from_samples(
        TrainingBatch.from_samples(samples), seed=0, phase=R2POPhase(HEAD_STAGE)
    )
    assert metrics["r2po_kl"] == pytest.approx(expected, abs=tol)
    assert metrics["kl"] == 0.0  # learner/kl is kl_coef's term (off): stage A's is r2po_kl
    # The objective is the policy term plus beta (0.04, the default) times this one: the same passes' sums, up to
    # float32 roundings of each pass's sum and of their weighted sums (16 ulps of the larger value).
    scale = max(abs(metrics["loss"]), abs(metrics["pg_loss"]))
    combined = metrics["pg_loss"] + 0.04 * metrics["r2po_kl"]
    assert metrics["loss"] == pytest.approx(combined, abs=f32_tol(scale, 16))


def _response_logprob_sums(learner: R3Learner, samples: list[Sample]) -> np.ndarray:
    """Sum of each response's token log-probs under the learner's current policy."""
    with torch.no_grad():
        old, _ = learner._recompute_old_logprobs(
            TrainingBatch.from_samples(samples), [np.arange(len(samples))]
        )
    return np.array([float(old[i].sum()) for i in range(len(samples))])  # rows are 0 off the response


def test_every_built_in_policy_loss_is_listed():
    """A loss registered in core/losses.py gets this file's learner tests by being listed in POLICY_LOSSES (the
    built-in ones: plugins and path losses other tests registered in this process are not this file's)."""
    from r3_rllib.core.losses import LOSS_FNS

    built_in = {name for name in LOSS_FNS.names() if LOSS_FNS[name].__module__ == "r3_rllib.core.losses"}
    assert {loss for loss, _ in POLICY_LOSSES} == built_in


@pytest.mark.parametrize("loss, agg_mode", POLICY_LOSSES)
def test_each_registered_policy_loss_updates_the_policy_through_the_learner(
    tiny_random_model, loss, agg_mode
):
    """Every loss the config accepts runs through the learner's update (micro-batches, normalisers, metrics): after
    one step at lr 1e-2 the positive-advantage responses became more likely on average and the negative ones less
    likely (deterministic: one thread, fixed samples and seed)."""
    samples = _samples(12)
    learner = _learner(tiny_random_model, policy_loss=loss, loss_agg_mode=agg_mode, num_minibatches=1)
    before = _response_logprob_sums(learner, samples)
    metrics = learner.update_from_samples(TrainingBatch.from_samples(samples), seed=0)
    moved = _response_logprob_sums(learner, samples) - before
    assert np.isfinite(metrics["pg_loss"]), metrics
    positive = np.array([s.advantage > 0 for s in samples])
    assert moved[positive].mean() > 0 > moved[~positive].mean(), (loss, moved)


def _with_tool_tokens(samples: list[Sample], tool_logprob: float) -> list[Sample]:
    """Each sample's response as model tokens, three tool tokens, model tokens; the tool tokens' behaviour
    log-prob set to `tool_logprob` (the engine reports none for them: they were not sampled)."""
    out = []
    for s in samples:
        head, tail = s.response_ids[:1], s.response_ids[1:] or [7]
        response = head + [11, 12, 13] + tail
        mask = np.array([True] * len(head) + [False] * 3 + [True] * len(tail))
        lp = np.full(len(response), -3.0, dtype=np.float32)
        lp[~mask] = tool_logprob
        out.append(
            Sample(**{**s.__dict__, "response_ids": response, "behavior_logprobs": lp, "loss_mask": mask})
        )
    return out


def test_tool_tokens_carry_no_loss_and_do_not_count_as_trained(tiny_random_model):
    """Multi-turn tool use: tokens a tool wrote (loss_mask False) neither enter the loss nor its token count, so
    the update does not depend on anything about them but their place in the context."""
    settings = dict(num_minibatches=1, num_epochs=1, off_policy_correction=True, is_cap=2.0)
    base = _samples(6)
    updates, trained = [], []
    for tool_logprob in (0.0, -40.0):
        learner = _learner(tiny_random_model, **settings)
        metrics = learner.update_from_samples(
            TrainingBatch.from_samples(_with_tool_tokens(base, tool_logprob)), seed=0
        )
        updates.append(_params(learner))
        trained.append(metrics["trained_tokens"])
    for a, b in zip(*updates, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    batch = TrainingBatch.from_samples(_with_tool_tokens(base, 0.0))
    model_tokens = int(batch.loss_mask.sum())
    assert trained == [model_tokens, model_tokens] and model_tokens == len(batch.response_ids) - 3 * len(base)
    # Without the mask the same tokens would be trained on (the check above can fail).
    unmasked = [Sample(**{**s.__dict__, "loss_mask": None}) for s in _with_tool_tokens(base, -40.0)]
    learner = _learner(tiny_random_model, **settings)
    learner.update_from_samples(TrainingBatch.from_samples(unmasked), seed=0)
    assert any((a - b).abs().max() > 1e-6 for a, b in zip(_params(learner), updates[0], strict=True))


def _mean_entropy(learner: R3Learner, samples: list[Sample]) -> float:
    """Mean entropy of the policy's tempered next-token distributions over the samples' response tokens."""
    from r3_rllib.algorithms.r3.rl_module import pack_samples

    packed = pack_samples(samples, learner._pad_id, "cpu")
    with torch.no_grad():
        _, entropy = learner._score(learner.policy, packed, with_entropy=True)
    return float(entropy[packed["response_mask"]].double().mean())


def _aggregate_entropy(learner: R3Learner, samples: list[Sample], agg_mode: str) -> float:
    """The policy's tempered entropies over the samples' response tokens, aggregated as ``agg_mode`` aggregates a
    loss (normalised by max_new_tokens where it says so)."""
    from r3_rllib.algorithms.r3.rl_module import pack_samples
    from r3_rllib.core.losses import aggregate_loss

    packed = pack_samples(samples, learner._pad_id, "cpu")
    with torch.no_grad():
        _, entropy = learner._score(learner.policy, packed, with_entropy=True)
    mask = packed["response_mask"]
    return float(aggregate_loss(entropy, mask, agg_mode, norm_len=learner.config.max_new_tokens))


@pytest.mark.parametrize(
    "loss, agg_mode",
    [*POLICY_LOSSES, ("clipped_pg", "seq-mean-token-sum-norm"), ("clipped_pg", "seq-mean-token-sum")],
)
def test_the_entropy_bonus_alone_raises_the_policy_entropy_and_is_logged(tiny_random_model, loss, agg_mode):
    """With every advantage zero (and no KL term) the policy loss has no gradient: the entropy bonus is the whole
    update, so the policy's entropy rises with it and nothing moves without it (one thread, fixed samples, seed).
    With every policy loss the config accepts, the bonus aggregated as the policy loss is."""
    samples = [dataclasses.replace(s, advantage=0.0) for s in random_samples(6, 0, max_response_len=6)]
    # Temperature 0.25: the tiny random model's tempered distributions sit well below the maximum entropy (about 4.1
    # of ln 100 nats), where one lr 1e-4 step raised it by ~0.24 (lr 1e-5: ~0.05, 1e-3: ~0.26).
    settings = dict(
        num_minibatches=1, num_epochs=1, lr=1e-4, temperature=0.25, loss_agg_mode=agg_mode, policy_loss=loss
    )
    off, on = (
        _learner(tiny_random_model, **settings),
        _learner(tiny_random_model, entropy_coef=0.01, **settings),
    )
    before = _mean_entropy(off, samples)
    start = _params(off)
    off_metrics = off.update_from_samples(TrainingBatch.from_samples(samples), seed=0)
    on_metrics = on.update_from_samples(TrainingBatch.from_samples(samples), seed=0)

    assert off_metrics["grad_norm"] == 0.0 and "entropy_bonus" not in off_metrics
    for a, b in zip(_params(off), start, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Far above what float32 scoring can move an entropy near 4 (forward_atol: ~1e-4).
    assert _mean_entropy(on, samples) > before + 100 * forward_atol(before)
    # Logged: entropy_coef times the entropies aggregated by loss_agg_mode (the update's one optimizer step scores
    # the policy before it), over the two micro-batches: the micro-batches' forward against one of the whole batch
    # (forward_atol), and float32 sums of a few tokens' entropies weighted by the micro-batches' shares.
    bonus = 0.01 * _aggregate_entropy(off_start := _learner(tiny_random_model, **settings), samples, agg_mode)
    assert (
        off_start.config.max_new_tokens > 6
    )  # seq-mean-token-sum-norm divides by it, not by the longest row
    tolerance = 0.01 * forward_atol(before) + f32_tol(0.05, 16)
    assert on_metrics["entropy_bonus"] == pytest.approx(bonus, abs=tolerance)
    assert on_metrics["entropy"] == pytest.approx(before, abs=forward_atol(before))
    assert on_metrics["loss"] == pytest.approx(
        on_metrics["pg_loss"] - on_metrics["entropy_bonus"], abs=f32_tol(0.05, 16)
    )


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_top_entropy_quantile_trains_on_the_high_entropy_tokens_through_the_learner(
    tiny_random_model, temperature
):
    """TRL's top_entropy_quantile through the learner's update (micro-batches of 3 rows), the entropies those of
    softmax(logits / T): about the top fifth of each micro-batch's tokens keep their policy gradient (logged), and
    the step differs from the full one."""
    samples = _samples(12)
    settings = dict(num_minibatches=1, num_epochs=1, lr=1e-3, temperature=temperature)
    full, top = (
        _learner(tiny_random_model, **settings),
        _learner(tiny_random_model, top_entropy_quantile=0.2, **settings),
    )
    full_metrics = full.update_from_samples(TrainingBatch.from_samples(samples), seed=0)
    top_metrics = top.update_from_samples(TrainingBatch.from_samples(samples), seed=0)
    assert "entropy_mask_frac" not in full_metrics
    # At least the single top token of each micro-batch, at most a fifth and a token or two of ties.
    assert 0.0 < top_metrics["entropy_mask_frac"] <= 0.35
    assert np.isfinite(top_metrics["loss"]) and top_metrics["grad_norm"] > 0
    moved = [not torch.equal(a, b) for a, b in zip(_params(full), _params(top), strict=True)]
    assert any(moved)


def test_the_entropy_bonus_trains_the_base_and_keeps_zero_advantage_groups():
    """R^2PO: the bonus is stage B's (the base), not stage A's (the head alone), as kl_coef; with the bonus on,
    groups whose advantages are all zero stay in the batch (their tokens carry it)."""
    from r3_rllib.algorithms.r3.iteration_settings import iteration_settings
    from r3_rllib.core.method import DEFAULT_PHASE

    cfg = R3Config.grpo_preset().training(entropy_coef=0.01)
    assert DEFAULT_PHASE.entropy_coef(cfg) == R2POPhase(BASE_STAGE).entropy_coef(cfg) == 0.01
    assert R2POPhase(HEAD_STAGE).entropy_coef(cfg) == 0.0
    assert iteration_settings(cfg, dataset_epoch=0, policy_version=0).keep_zero_advantage
    plain = R3Config.grpo_preset()
    assert not iteration_settings(plain, dataset_epoch=0, policy_version=0).keep_zero_advantage


def test_r2po_stage_a_has_no_entropy_bonus_and_stage_b_has_it(tiny_random_model):
    learner = _learner(tiny_random_model, rollout_head=True, entropy_coef=0.01, num_minibatches=1)
    batch = TrainingBatch.from_samples(_samples(6))
    head = learner.update_from_samples(batch, seed=0, phase=R2POPhase(HEAD_STAGE))
    base = learner.update_from_samples(batch, seed=0, phase=R2POPhase(BASE_STAGE))
    # Nothing but the policy term in stage A: the head starts at zero, so its KL to the initial model is 0 too.
    assert "entropy_bonus" not in head and head["loss"] == head["pg_loss"]
    assert base["entropy_bonus"] > 0 and base["loss"] < base["pg_loss"]
