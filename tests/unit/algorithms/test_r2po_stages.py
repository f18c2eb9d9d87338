"""R^2PO in the algorithm: stage schedule, per-stage batch settings, stage-B skip rule, config validation, and the
learner's pieces (rollout log-probs, frozen parameters bit-identical through AdamW with weight decay)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, forward_atol

from r3_rllib.algorithms.r3.config import R3Config
from r3_rllib.algorithms.r3.groups import build_training_batch
from r3_rllib.algorithms.r3.iteration_settings import iteration_settings
from r3_rllib.core.advantages import grpo_advantages
from r3_rllib.core.logprobs import token_logprobs
from r3_rllib.engines import make_engine
from r3_rllib.engines.rollout_head_sampling import RolloutHeadHFEngine
from r3_rllib.engines.vllm_engine import model_weight_folder
from r3_rllib.models.rollout_head import (
    RolloutHead,
    attach_rollout_head,
    rollout_token_logprobs,
    save_rollout_head,
)
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny
from r3_rllib.r2po.method import (
    STAGE_B_ESTIMATOR,
    iteration_stage,
    param_groups,
    set_stage_trainable,
    stage_b_advantages,
    stage_head_kl_coef,
    stage_is_cap,
    stage_settings,
)
from r3_rllib.types.samples import Group, Sample

torch.set_num_threads(TORCH_THREADS)


# -- schedule ---------------------------------------------------------------------------------------------------------
def _cfg(**kw) -> SimpleNamespace:
    base = dict(
        rollout_head=True,
        rollout_head_head_iters=2,
        rollout_head_base_iters=3,
        rollout_head_first_stage="head",
    )
    return SimpleNamespace(**{**base, **kw})


def test_stage_follows_the_iteration_count():
    stages = "".join(iteration_stage(_cfg(), i) for i in range(10))
    assert stages == "AABBBAABBB"
    assert "".join(iteration_stage(_cfg(rollout_head_first_stage="base"), i) for i in range(6)) == "BBBAAB"
    assert "".join(iteration_stage(_cfg(rollout_head_base_iters=0), i) for i in range(3)) == "AAA"
    assert iteration_stage(_cfg(rollout_head=False), 0) is None


def test_each_iteration_reports_its_own_stage_numbers_and_not_the_other_stages_as_nan():
    """A, B, A, B: ``r2po/<stage>`` holds the iteration's stage alone; the other stage's numbers, logged an iteration
    before, are absent (RLlib would report them NaN), and a B that trained nothing has only its batch's numbers."""
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    from r3_rllib.r2po.method import R2POPhase
    from r3_rllib.r2po.stages import BASE_STAGE, HEAD_STAGE

    logger = MetricsLogger()
    batch = {"train_samples": 16.0, "zero_adv_frac": 0.25}
    update = {"loss": 0.5, "grad_norm": 2.0, "trained_tokens": 40.0}
    results = []
    for stage, learner in zip((HEAD_STAGE, BASE_STAGE) * 2, (update, update, update, {}), strict=True):
        R2POPhase(stage).log_metrics(logger, batch, learner)
        results.append(MetricsLogger.peek_results(logger.reduce())["r2po"])
    numbers = batch | {"loss": 0.5, "grad_norm": 2.0}  # the update's STAGE_KEYS, under its stage
    assert results == [
        {"stage": 0.0, "A": numbers},
        {"stage": 1.0, "B": numbers},
        {"stage": 0.0, "A": numbers},
        {"stage": 1.0, "B": batch},
    ]


# -- batch settings and the skip rule -----------------------------------------------------------------------------
def test_stage_settings_switch_estimator_and_r3_parts():
    cfg = (
        R3Config.r3_preset()
        .r3(replay_start_epoch=0, ranking_start_epoch=0)
        .training(rollout_head=True, kl_coef=0.1)
    )
    settings = iteration_settings(cfg, dataset_epoch=0, policy_version=0)
    assert stage_settings(settings, None, cfg) is settings
    a = stage_settings(settings, "A", cfg)
    assert a.advantage_estimator == "rarity" and not a.replay and not a.ranking and not a.keep_zero_advantage
    b = stage_settings(settings, "B", cfg)
    assert b.advantage_estimator == STAGE_B_ESTIMATOR and b.replay and b.ranking and b.keep_zero_advantage
    assert b.advantage_params == {
        "base": "mixed",
        "base_params": {"alpha": cfg.adv_alpha, "lam": cfg.adv_lambda},
        "min_range": cfg.rollout_head_skip_range,
    }


def test_stage_b_skips_flat_groups_and_otherwise_is_the_task_estimator():
    params = {"eps": 1e-6, "ddof": 0}
    r = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(
        stage_b_advantages(r, base="grpo", base_params=params, min_range=0.01), grpo_advantages(r, **params)
    )
    flat = np.array([1.0, 1.005, 1.0, 1.0])  # range 0.005 < 0.01: noise, not signal
    assert not np.any(stage_b_advantages(flat, base="grpo", base_params=params, min_range=0.01))
    assert np.any(stage_b_advantages(flat, base="grpo", base_params=params, min_range=0.0))


def _group(qid: str, rewards: list[float]) -> Group:
    samples = [
        Sample(qid, [5], [6, 1], np.zeros(2, np.float32), np.zeros(2, np.float32), r, r > 0.5, False, 0)
        for r in rewards
    ]
    return Group(qid, samples)


def test_batches_per_stage_rarity_for_the_head_skip_for_the_base():
    cfg = R3Config.grpo_preset().training(rollout_head=True, rollout_head_skip_range=0.01)
    settings = iteration_settings(cfg, dataset_epoch=0, policy_version=0)
    groups = [_group("q1", [1, 0, 0, 0]), _group("q2", [1, 1, 1, 1.004]), _group("q3", [1, 1, 0, 0])]
    a, _ = build_training_batch(groups, stage_settings(settings, "A", cfg))
    # rarity over the correct flags: q1's lone success is the rare outcome; q2 is all correct (1.004 is a distinct
    # reward value, not a distinct outcome) and q3's equal-size buckets are degenerate: all zeros, left out
    assert {s.query_id for s in a} == {"q1"}
    assert [s.advantage > 0 for s in a if s.query_id == "q1"] == [True, False, False, False]
    # count="reward": the reference code's value counting makes q2's 1.004 a rare outcome
    by_value = cfg.copy(copy_frozen=False).training(rollout_head_rarity_count="reward")
    a2, _ = build_training_batch(groups, stage_settings(settings, "A", by_value))
    assert {s.query_id for s in a2} == {"q1", "q2"}
    b, _ = build_training_batch(groups, stage_settings(settings, "B", cfg))
    assert {s.query_id for s in b} == {"q1", "q3"}  # q2's range 0.004 is skipped


def test_stage_b_importance_weight_setting():
    cfg = SimpleNamespace(is_cap=2.0, off_policy_correction=True, rollout_head_stage_b_weight="truncated_is")
    assert stage_is_cap(cfg, "B") == 2.0 and stage_is_cap(cfg, "A") == 2.0 and stage_is_cap(cfg, None) == 2.0
    cfg.rollout_head_stage_b_weight = "none"
    assert stage_is_cap(cfg, "B") is None and stage_is_cap(cfg, "A") == 2.0
    cfg.off_policy_correction = False
    assert stage_is_cap(cfg, "A") is None


# -- config validation -------------------------------------------------------------------------------------------
def test_defaults_validate_and_leave_r2po_off():
    cfg = R3Config.grpo_preset()
    cfg.validate()
    assert (
        cfg.rollout_head is False and cfg.get_default_rl_module_spec().model_config["rollout_head"] is False
    )
    R3Config.r3_preset().training(rollout_head=True).validate()  # R^3 combines with stage B


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"advantage_estimator": "hgpo"}, "multi-step estimator 'hgpo'"),
        ({"advantage_estimator": "rarity"}, "rollout-head advantage, not a policy estimator"),
        ({"advantage_estimator": STAGE_B_ESTIMATOR}, "internal stage-B wrapper"),
        ({"rollout_head_stage_b_weight": "full"}, "rollout_head_stage_b_weight must be one of"),
        ({"rollout_head_head_iters": 0, "rollout_head_base_iters": 0}, "cannot both be 0"),
        ({"rollout_head_first_stage": "A"}, "rollout_head_first_stage must be one of"),
        ({"rollout_head_advantage": "nope"}, "rollout_head_advantage must be one of"),
        ({"rollout_head_rarity_count": "values"}, "rollout_head_rarity_count must be one of"),
        ({"rollout_head_init_std": 0.0}, "rollout_head_init_std must be finite and > 0"),
        ({"rollout_head_skip_range": -1.0}, "rollout_head_skip_range must be finite and >= 0"),
        ({"rollout_head_skip_range": float("inf")}, "rollout_head_skip_range must be finite and >= 0"),
        ({"rollout_head_lr": float("inf")}, "rollout_head_lr must be finite and > 0"),
        ({"rollout_head_kl_coef": -0.1}, "rollout_head_kl_coef must be finite and >= 0"),
    ],
)
def test_invalid_r2po_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        R3Config.grpo_preset().training(rollout_head=True, **kwargs).validate()


# -- learner pieces on the tiny model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _model_with_head(tok, seed: int = 0):
    model = build_tiny_model(tok, seed=seed)
    # A head far from zero, so that head-on and head-off log-probs differ visibly.
    head = attach_rollout_head(model, RolloutHead.for_model(model, init_std=0.05, seed=1))
    return model, head


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 20, (3, 9), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 7:] = 0
    resp = torch.zeros((3, 8), dtype=torch.bool)
    resp[:, 3:6] = True
    return ids, attn, resp


def test_stage_a_alone_has_the_head_kl_term():
    cfg = SimpleNamespace(rollout_head_kl_coef=0.04)
    assert R3Config().rollout_head_kl_coef == 0.04  # the reference code's beta
    assert stage_head_kl_coef(cfg, "A") == 0.04
    assert stage_head_kl_coef(cfg, "B") == 0.0
    assert stage_head_kl_coef(cfg, None) == 0.0


@pytest.mark.parametrize("head_swap", [True, False])
def test_learner_rollout_logprobs_match_the_head_module(tok, monkeypatch, head_swap):
    import r3_rllib.core.logprobs as logprobs_module

    if not head_swap:  # the full-logits path of models whose forward post-processes the logits
        monkeypatch.setattr(logprobs_module, "_head_swap_supported", lambda model: False)
    model, head = _model_with_head(tok)
    ids, attn, resp = _batch()
    with torch.no_grad():
        roll, base = rollout_token_logprobs(model, ids, attn, resp, temperature=0.7)
        ours_roll, _ = token_logprobs(
            model, ids, attn, response_mask=resp, temperature=0.7, rollout_head=head
        )
        ours_base, _ = token_logprobs(model, ids, attn, response_mask=resp, temperature=0.7)
    # other code paths (head swap or full logits, chunks) over the same tokens: forward_atol, tests/numeric.py
    tol = forward_atol(roll, base)
    torch.testing.assert_close(ours_roll, roll, atol=tol, rtol=0)
    torch.testing.assert_close(ours_base, base, atol=tol, rtol=0)
    assert (ours_roll - ours_base).abs().max() > 1e-3
    # Both from one call (stage A's KL term): the base ones without gradient, the rollout ones with it.
    both_roll, _, both_base = token_logprobs(
        model, ids, attn, response_mask=resp, temperature=0.7, rollout_head=head, with_base=True, chunk=4
    )
    torch.testing.assert_close(both_roll.detach(), roll, atol=tol, rtol=0)
    torch.testing.assert_close(both_base, base, atol=tol, rtol=0)
    assert both_roll.requires_grad and not both_base.requires_grad


def _one_step(model, head, stage: str, lr_head: float | None):
    set_stage_trainable(model, stage)
    opt = torch.optim.AdamW(param_groups(model, head, lr_head), lr=1e-2, weight_decay=0.1)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for seed in range(2):  # two steps: the second has AdamW moments, the first none
        ids, attn, resp = _batch(seed)
        opt.zero_grad(set_to_none=True)
        lp, _ = token_logprobs(
            model, ids, attn, response_mask=resp, rollout_head=head if stage == "A" else None
        )
        (-(lp * resp).sum() / resp.sum()).backward()
        opt.step()
    after = model.state_dict()
    return {k: torch.equal(before[k], after[k]) for k in before}


@pytest.mark.parametrize("lr_head", [None, 3e-2])
def test_stage_a_leaves_base_bit_identical_and_stage_b_the_head(tok, lr_head):
    model, head = _model_with_head(tok)
    same = _one_step(model, head, "A", lr_head)
    assert all(v for k, v in same.items() if not k.startswith("rollout_head.")), "stage A moved base weights"
    assert not any(v for k, v in same.items() if k.startswith("rollout_head.")), (
        "stage A left the head as it was"
    )
    same = _one_step(model, head, "B", lr_head)
    assert all(v for k, v in same.items() if k.startswith("rollout_head.")), "stage B moved the head"
    assert not all(v for k, v in same.items() if not k.startswith("rollout_head."))


# -- engines -----------------------------------------------------------------------------------------------------
def test_make_engine_builds_the_rollout_head_engine(tok, tmp_path):
    save_tiny(build_tiny_model(tok, seed=0), tok, tmp_path)
    engine = make_engine("hf", tmp_path, rollout_head=True, head_seed=3)
    assert isinstance(engine, RolloutHeadHFEngine) and engine.rollout_logits
    with pytest.raises(ValueError, match="need rollout_head=True"):
        make_engine("hf", tmp_path, rollout_logits=False)


def test_vllm_gets_the_model_weights_without_a_head_saved_beside_them(tok, tmp_path):
    model = build_tiny_model(tok, seed=0)
    save_tiny(model, tok, tmp_path)
    folder, keep = model_weight_folder(tmp_path)
    assert folder == tmp_path and keep is None
    save_rollout_head(RolloutHead.for_model(model, seed=0), tmp_path)
    folder, keep = model_weight_folder(tmp_path)
    try:
        names = {p.name for p in folder.iterdir()}
        assert "rollout_head.safetensors" not in names and "model.safetensors" in names
        assert "config.json" in names and "rollout_head.json" in names
    finally:
        keep.cleanup()


def test_shipped_example_validates():
    from repo_paths import REPO

    from r3_rllib.train_config import load_run_file

    config = load_run_file(REPO / "examples" / "r2po_arithmetic_cpu.yaml").config
    assert config.rollout_head and config.rollout_head_stage_b_weight == "truncated_is"
