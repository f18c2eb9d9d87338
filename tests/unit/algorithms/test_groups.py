"""R^3 batch assembly: replay requests, ranking in all-wrong groups, mixed-group advantages (hand-computed)."""

import math
from dataclasses import replace

import numpy as np
import pytest

from r3_rllib.algorithms.r3.groups import (
    build_training_batch,
    ranking_rewards,
    replay_requests,
    rescore_ranking_entropies,
    select_dynamic_groups,
)
from r3_rllib.core.iteration import IterationSettings
from r3_rllib.core.reward_shaping import OverlongShaping
from r3_rllib.types.samples import Group, Sample


def _sample(qid, reward, correct, entropies=(1.0,), version=0):
    n = len(entropies)
    return Sample(
        query_id=qid,
        prompt_ids=[1, 2],
        response_ids=list(range(3, 3 + n)),
        behavior_logprobs=np.zeros(n, np.float32),
        entropies=np.asarray(entropies, np.float32),
        reward=reward,
        correct=correct,
        truncated=False,
        policy_version=version,
    )


def _group(qid, rewards, entropies=None):
    entropies = entropies or [(1.0,)] * len(rewards)
    return Group(qid, [_sample(qid, r, r >= 1.0, e) for r, e in zip(rewards, entropies, strict=True)])


def test_degenerate_and_requests():
    groups = [_group("a", [0, 0]), _group("b", [1, 1]), _group("c", [0, 1])]
    assert replay_requests(groups, 3) == [("a", True, 3), ("b", False, 3)]
    assert replay_requests(groups, 0) == []


def test_plain_grpo_drops_collapsed_groups_and_normalises():
    groups = [_group("a", [0, 0, 0, 0]), _group("b", [1, 0, 0, 0])]
    batch, m = build_training_batch(
        groups, IterationSettings(advantage_estimator="grpo", advantage_params={"eps": 0.0})
    )
    assert m["zero_adv_frac_before"] == 0.5 and m["zero_adv_frac"] == 0.5
    assert m["trained_groups"] == 1.0  # b; a collapsed
    assert len(batch) == 4 and all(s.query_id == "b" for s in batch)
    # rewards [1,0,0,0]: mean 0.25, population std sqrt(3)/4 -> advantages sqrt(3) and -1/sqrt(3)
    np.testing.assert_allclose(
        [s.advantage for s in batch], [np.sqrt(3), -1 / np.sqrt(3)] + [-1 / np.sqrt(3)] * 2
    )


def test_replay_revives_all_wrong_group_with_mixed_advantages():
    groups = [_group("a", [0, 0, 0])]

    def fetch(requests):
        assert requests == [("a", True, 1)]
        return [[_sample("a", 1.0, True, version=0)]]

    sw = IterationSettings(
        replay=True, replay_k=1, advantage_estimator="mixed", advantage_params={"alpha": 1.0, "lam": 0.0}
    )
    batch, m = build_training_batch(groups, sw, fetch)
    assert m["zero_adv_frac_before"] == 1.0 and m["zero_adv_frac"] == 0.0
    assert m["replay_hits"] == 1 and m["replay_samples"] == 1
    # G_mix rewards [0,0,0,1]: mean 0.25, std sqrt(3)/4 -> (1-0.25)/(sqrt(3)/4) = sqrt(3)
    assert [s.is_replay for s in batch] == [False, False, False, True]
    np.testing.assert_allclose(batch[-1].advantage, np.sqrt(3))
    np.testing.assert_allclose(batch[0].advantage, -1 / np.sqrt(3))


def test_replay_miss_leaves_group_collapsed():
    batch, m = build_training_batch(
        [_group("a", [1, 1])], IterationSettings(replay=True, replay_k=2), lambda reqs: [[] for _ in reqs]
    )
    assert batch == [] and m["replay_requests"] == 1 and m["replay_hits"] == 0 and m["zero_adv_frac"] == 1.0


def test_ranking_grades_failures_below_correct_reward():
    # Response 0: high peak, low global entropy -> dominates response 1 (low peak, high global).
    ent = [(3.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0)]
    sw = IterationSettings(
        ranking=True,
        ranking_p=0.25,
        ranking_r_max=0.5,
        advantage_estimator="grpo",
        advantage_params={"eps": 0.0},
    )
    batch, m = build_training_batch([_group("a", [0, 0], ent)], sw)
    assert m["ranked_groups"] == 1 and m["zero_adv_frac_before"] == 1.0 and m["zero_adv_frac"] == 0.0
    assert [s.reward for s in batch] == pytest.approx([0.5, 0.0])
    assert [s.env_reward for s in batch] == [0.0, 0.0]  # what goes to the replay buffer
    assert batch[0].advantage == pytest.approx(1.0) and batch[1].advantage == pytest.approx(-1.0)


def test_reflection_groups_are_trained_but_not_counted_as_fresh():
    refl = _group("a", [1, 0])
    refl.is_reflection = True
    for s in refl.samples:
        s.is_reflection = True
    batch, m = build_training_batch(
        [_group("a", [0, 0]), refl], IterationSettings(replay=True), lambda r: [[] for _ in r]
    )
    assert m["zero_adv_frac_before"] == 1.0 and m["zero_adv_frac"] == 1.0  # only the fresh group counts
    assert m["replay_requests"] == 1  # the reflection group asks for nothing
    assert m["train_reflected"] == 2 and len(batch) == 2


def test_collapsed_groups_stay_in_the_batch_with_zero_advantage_when_kl_is_on():
    """With a KL term a collapsed group still trains (KL only): it is kept with advantage 0, so the loss's token
    count covers it; the informative group's advantages are those of plain GRPO."""
    stale = _sample("a", 0.0, False)
    stale.advantage = 0.7  # left over from an earlier batch: must be reset
    groups = [Group("a", [stale, _sample("a", 0.0, False)]), _group("b", [1, 0, 0, 0]), _group("c", [1, 1])]
    sw = IterationSettings(
        advantage_estimator="grpo", advantage_params={"eps": 0.0}, keep_zero_advantage=True
    )
    batch, m = build_training_batch(groups, sw)
    assert [s.query_id for s in batch] == ["a", "a", "b", "b", "b", "b", "c", "c"]
    np.testing.assert_allclose(
        [s.advantage for s in batch], [0.0, 0.0, np.sqrt(3)] + [-1 / np.sqrt(3)] * 3 + [0.0, 0.0]
    )
    assert m["zero_adv_frac"] == pytest.approx(2 / 3)  # still reported as collapsed
    assert m["train_samples"] == 8 and m["train_zero_adv_samples"] == 4

    # Without a KL term the same groups lose their two collapsed groups.
    batch, m = build_training_batch(
        groups, IterationSettings(advantage_estimator="grpo", advantage_params={"eps": 0.0})
    )
    assert [s.query_id for s in batch] == ["b"] * 4
    assert m["train_samples"] == 4 and m["train_zero_adv_samples"] == 0


def test_an_estimator_declaring_sample_inputs_receives_the_groups_step_keys():
    from r3_rllib.core.advantages import ADVANTAGE_FNS, register_advantage

    seen = {}

    @register_advantage("test_keys", sample_inputs=("traj_ids", "step_indices", "obs_keys"))
    def keyed(rewards, *, traj_ids, step_indices, obs_keys):
        seen.update(traj_ids=traj_ids, step_indices=step_indices, obs_keys=obs_keys)
        return np.asarray(rewards, dtype=np.float64) - np.mean(rewards)

    try:
        group = _group("q", [1.0, 0.0])
        for i, s in enumerate(group.samples):
            s.trajectory_id, s.step_index, s.obs_key = f"t{i}", 3 - i, ("room", i)
        batch, _ = build_training_batch([group], IterationSettings(advantage_estimator="test_keys"))
        assert seen == {
            "traj_ids": ["t0", "t1"],
            "step_indices": [3, 2],
            "obs_keys": [("room", 0), ("room", 1)],
        }
        assert [s.advantage for s in batch] == [0.5, -0.5]
    finally:
        del ADVANTAGE_FNS["test_keys"]


def test_an_unknown_sample_input_is_named_in_the_error():
    from r3_rllib.core.advantages import ADVANTAGE_FNS, register_advantage

    register_advantage("test_bad_keys", sample_inputs=("colour",))(lambda rewards, *, colour: rewards)
    try:
        with pytest.raises(ValueError, match="sample input 'colour'"):
            build_training_batch(
                [_group("q", [1.0, 0.0])], IterationSettings(advantage_estimator="test_bad_keys")
            )
    finally:
        del ADVANTAGE_FNS["test_bad_keys"]


def test_batch_building_leaves_its_inputs_unchanged():
    """Ranking, replay and advantages land on copies: the rollout's groups still hold the env's rewards (what the
    rollout metrics and the replay buffer read)."""
    ent = [(3.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0)]
    groups = [_group("a", [0, 0], ent)]
    stored = _sample("a", 1.0, True)
    settings = IterationSettings(
        replay=True, replay_k=1, ranking=True, ranking_p=0.25, advantage_params={"eps": 0.0}
    )
    batch, m = build_training_batch(groups, settings, lambda reqs: [[stored]])
    assert m["ranked_groups"] == 1 and m["train_replayed"] == 1
    assert [s.reward for s in groups[0].samples] == [0.0, 0.0]
    assert [s.advantage for s in groups[0].samples] == [0.0, 0.0]
    assert stored.is_replay is False and stored.advantage == 0.0
    assert [s.reward for s in batch] == pytest.approx([0.5, 0.0, 1.0]) and batch[2].is_replay


def test_rollout_totals_merge_over_runners_into_means():
    """Hand-computed: runner 1 has one fresh group [1, 0] (3 and 1 tokens) and a reflection group [1, 1]; runner 2
    one collapsed group [0, 0] (2 tokens each, truncated)."""
    from r3_rllib.algorithms.r3.groups import merge_rollout_totals, rollout_means
    from r3_rllib.rollout.kinds.base import rollout_totals

    a = _group("a", [1.0, 0.0], [(1.0, 1.0, 1.0), (3.0,)])
    refl = _group("r", [1.0, 1.0])
    refl.is_reflection = True
    b = _group("b", [0.0, 0.0], [(2.0, 4.0), (0.0, 0.0)])
    for s in b.samples:
        s.truncated = True
    merged = merge_rollout_totals(rollout_totals([a, refl]), rollout_totals([b]))
    means = rollout_means(merged)
    assert merged["samples"] == 4 and merged["response_len_max"] == 3
    assert means["accuracy"] == 0.25 and means["reward_mean"] == 0.25
    assert means["response_len_mean"] == (3 + 1 + 2 + 2) / 4 and means["truncated_frac"] == 0.5
    assert means["entropy_mean"] == pytest.approx((1.0 + 3.0 + 3.0 + 0.0) / 4)
    assert means["zero_adv_frac_before"] == 0.5  # b collapsed, a did not; the reflection group is apart
    assert means["reflection_prompts"] == 1 and means["reflection_success"] == 1.0
    assert rollout_means({})["accuracy"] == 0.0


def test_replay_form_round_trip_keeps_the_task_reward():
    """The replay form keeps the task reward (the env's, or the reward server's composition: types/samples.py),
    not a ranking reward."""
    s = _sample("q", 1.0, True, entropies=(0.5, 0.5), version=3)
    ranked = Sample(**{**s.__dict__, "reward": 0.4})
    ranked.env_reward = ranked.task_reward = 0.0
    stored = ranked.to_replay()
    assert stored.reward == 0.0 and stored.prompt_ids.dtype == np.int32 and stored.policy_version == 3
    back = Sample.from_replay(stored)
    assert back.is_replay and back.reward == 0.0 and back.response_ids == s.response_ids
    assert back.entropies.size == 0


def _sized(qid, rewards, lengths):
    """A group whose samples have the given rewards (>= 1: correct) and response lengths."""
    return Group(
        qid,
        [
            replace(_sample(qid, r, r >= 1.0), response_ids=list(range(n)))
            for r, n in zip(rewards, lengths, strict=True)
        ],
    )


def test_opo_reads_each_members_trained_tokens():
    # Rewards [1, 0, 0] of 1, 2 and 5 tokens: b = 1 / 8. A tool's tokens (loss_mask False) are not trained: the
    # third response's 5 tokens count 2, and b = 1 / 5.
    group = _sized("a", [1.0, 0.0, 0.0], [1, 2, 5])
    batch, _ = build_training_batch([group], IterationSettings(advantage_estimator="opo"))
    np.testing.assert_allclose([s.advantage for s in batch], [7 / 8, -1 / 8, -1 / 8])
    masked = replace(group.samples[2], loss_mask=np.array([1, 0, 0, 0, 1], dtype=bool))
    batch, _ = build_training_batch(
        [Group("a", [*group.samples[:2], masked])], IterationSettings(advantage_estimator="opo")
    )
    np.testing.assert_allclose([s.advantage for s in batch], [4 / 5, -1 / 5, -1 / 5])


def test_overlong_penalty_is_added_before_advantages():
    # L_max = 8, L_cache = 4: lengths 4, 6, 8 get 0, -0.5, -1. Rewards [1, 1, 0] -> [1, 0.5, -1]:
    # mean 1/6, population std sqrt(((5/6)^2 + (1/3)^2 + (7/6)^2) / 3) = sqrt(13/18).
    settings = IterationSettings(
        advantage_estimator="grpo",
        advantage_params={"eps": 0.0},
        overlong=OverlongShaping(max_length=8, buffer_length=4),
    )
    batch, m = build_training_batch([_sized("a", [1.0, 1.0, 0.0], [4, 6, 8])], settings)
    assert [s.reward for s in batch] == [1.0, 0.5, -1.0]
    assert [s.env_reward for s in batch] == [1.0, 1.0, 0.0]
    std = np.sqrt(13 / 18)
    np.testing.assert_allclose([s.advantage for s in batch], np.array([5 / 6, 1 / 3, -7 / 6]) / std)
    assert m["overlong_penalty_mean"] == pytest.approx(-0.5) and m["overlong_frac"] == pytest.approx(2 / 3)
    # An all-correct group of different lengths now has a signal: the shorter answer is preferred.
    batch, _ = build_training_batch([_sized("b", [1.0, 1.0], [4, 8])], settings)
    assert batch[0].advantage > 0 > batch[1].advantage


def test_dynamic_sampling_filters_on_accuracy_and_trims_to_the_target():
    # Rounds of 3 queries, target 3: round 1 keeps only "m1"; round 2 adds "m2" and "m3"; round 3 adds "m4",
    # which the trim drops (the first 3 in sampling order are kept). "c" is all correct with a length bonus
    # (rewards differ): dropped on accuracy, as DAPO does.
    r1 = [_group("w1", [0, 0]), _group("m1", [1, 0]), _group("c", [1.5, 1.2])]
    r2 = [_group("m2", [0, 1]), _group("m3", [1, 0]), _group("w2", [0, 0])]
    r3 = [_group("m4", [1, 0]), _group("w3", [0, 0]), _group("c2", [1, 1])]
    chosen, passed = select_dynamic_groups(r1, target=3, metric="accuracy")
    assert [g.query_id for g in chosen] == ["m1"] and passed == 1
    chosen, passed = select_dynamic_groups(r1 + r2, target=3, metric="accuracy")
    assert [g.query_id for g in chosen] == ["m1", "m2", "m3"] and passed == 3
    chosen, passed = select_dynamic_groups(r1 + r2 + r3, target=3, metric="accuracy")
    assert [g.query_id for g in chosen] == ["m1", "m2", "m3"] and passed == 4
    # On reward, the all-correct group with a length bonus carries a signal and passes.
    chosen, passed = select_dynamic_groups(r1, target=3, metric="reward")
    assert [g.query_id for g in chosen] == ["m1", "c"] and passed == 2


def test_dynamic_sampling_on_reward_sees_the_overlong_penalty_and_keeps_reflection_groups():
    # All correct, lengths 4 and 8 with L_max 8, L_cache 4: shaped rewards 1 and 0 differ -> passes on reward.
    overlong = OverlongShaping(max_length=8, buffer_length=4)
    long_short = _sized("a", [1.0, 1.0], [4, 8])
    assert select_dynamic_groups([long_short], target=1, metric="reward")[1] == 0
    assert select_dynamic_groups([long_short], target=1, metric="reward", overlong=overlong)[1] == 1
    # Reflection groups do not count toward the target and are not trimmed; uninformative ones are dropped.
    refl = Group("r", _group("r", [1, 0]).samples, is_reflection=True)
    flat_refl = Group("s", _group("s", [0, 0]).samples, is_reflection=True)
    fresh = [_group("m1", [1, 0]), _group("m2", [1, 0])]
    chosen, passed = select_dynamic_groups([refl, flat_refl, *fresh], target=1, metric="accuracy")
    assert [g.query_id for g in chosen] == ["r", "m1"] and passed == 2


def test_learner_entropies_replace_the_engines_in_rankable_groups_only():
    # Two all-wrong groups (a rankable pair, a lone sample) and a mixed group: only the pair is rescored, in one call.
    # Engine entropies: response 0 (0, 3) has E_peak 3 > 2 and E_global 1.5 < 2 of response 1 (2,): it dominates.
    wrong = _group("w", [0, 0], entropies=[(0.0, 3.0), (2.0,)])
    lone = _group("l", [0])
    mixed = _group("m", [1, 0])
    calls = []

    def score(samples):
        calls.append([s.query_id for s in samples])
        return [np.full(len(s.response_ids), 1.5) for s in samples]

    assert list(ranking_rewards(wrong, p=0.5, r_max=0.5)) == [0.5, 0.0]
    out, m = rescore_ranking_entropies([wrong, lone, mixed], score)
    assert calls == [["w", "w"]]
    assert out[1] is lone and out[2] is mixed
    assert [list(s.entropies) for s in out[0].samples] == [[1.5, 1.5], [1.5]]
    assert [list(s.entropies) for s in wrong.samples] == [[0.0, 3.0], [2.0]]  # inputs untouched
    # engine - learner over 3 tokens: (-1.5 + 1.5 + 0.5) / 3
    assert m == {
        "ranking_entropy_tokens": 3.0,
        "ranking_entropy_bias": pytest.approx(0.5 / 3),
        "ranking_entropy_abs_diff": pytest.approx(3.5 / 3),
    }
    # The ranking reads the new entropies: equal profiles tie at r_max / 2.
    assert list(ranking_rewards(out[0], p=0.5, r_max=0.5)) == [0.25, 0.25]
    with pytest.raises(ValueError, match="values for a response"):
        rescore_ranking_entropies([wrong], lambda samples: [np.zeros(5) for _ in samples])
    assert rescore_ranking_entropies([mixed], score)[1]["ranking_entropy_tokens"] == 0.0


def test_reinforce_plus_plus_baseline_whitens_over_every_member_token_replayed_and_zero_groups_included():
    # a = [0, 0, 0] plus one replayed success: G_mix [0, 0, 0, 1] -> centred [-.25, -.25, -.25, .75];
    # b = [1, 1, 0, 0] -> [.5, .5, -.5, -.5], its first response 3 tokens long; c = [1, 1] asks for a failure
    # and gets none -> zeros. Every other response has 1 token.
    groups = [
        _group("a", [0, 0, 0]),
        _group("b", [1, 1, 0, 0], entropies=[(1.0, 1.0, 1.0), (1.0,), (1.0,), (1.0,)]),
        _group("c", [1, 1]),
    ]

    def fetch(requests):
        assert requests == [("a", True, 1), ("c", False, 1)]
        return [[_sample("a", 1.0, True)], []]

    name = "reinforce_plus_plus_baseline"
    settings = IterationSettings(replay=True, replay_k=1, advantage_estimator=name, batch_step=name)
    # verl's whitening over the 12 tokens: mu = (3 * .5 + .5 - .5 - .5) / 12 = 1/12; variance with Bessel's
    # correction over tokens: sum_i n_i (a_i - mu)^2 / 11.
    centred = np.array([-0.25, -0.25, -0.25, 0.75, 0.5, 0.5, -0.5, -0.5, 0.0, 0.0])
    counts = np.array([1, 1, 1, 1, 3, 1, 1, 1, 1, 1])
    mu = 1.0 / 12.0
    var = float(counts @ (centred - mu) ** 2) / 11.0
    expected = (centred - mu) / np.sqrt(var + 1e-8)
    batch, m = build_training_batch(groups, settings, fetch)
    # c's equal rewards get -mu / std (verl trains on them): no group is left without gradient.
    assert [s.query_id for s in batch] == ["a"] * 4 + ["b"] * 4 + ["c"] * 2
    assert batch[3].is_replay
    np.testing.assert_allclose([s.advantage for s in batch], expected, rtol=1e-12)
    assert batch[8].advantage == pytest.approx(-mu / np.sqrt(var), rel=1e-6) and m["zero_adv_frac"] == 0.0
    # Without the batch step the same estimator is a plain group-mean baseline (c left out: no gradient).
    plain, _ = build_training_batch(groups, replace(settings, batch_step=None), fetch)
    np.testing.assert_allclose([s.advantage for s in plain], centred[:8])


def test_no_group_left_to_train_reports_no_fraction_rather_than_zero():
    """DAPO with every group filtered hands the batch builder nothing: "0 % zero-advantage groups" would read as
    "every group useful"; the fraction is undefined (nan) and trained_groups says what happened (0)."""
    batch, m = build_training_batch(
        [], IterationSettings(advantage_estimator="grpo", advantage_params={"eps": 0.0})
    )
    assert batch == [] and m["trained_groups"] == 0.0 and np.isnan(m["zero_adv_frac"])


def test_grpo_batch_std_divides_group_centred_advantages_by_the_batchs_reward_std():
    """TRL's scale_rewards='batch': a = [1, 0, 0, 1] -> centred [.5, -.5, -.5, .5]; b = [1, 1, 1, 0] -> [.25, .25,
    .25, -.75]; the eight rewards' sample std: mean 0.625, sum of squares 5 x 0.375^2 + 3 x 0.625^2 = 1.875, over
    7: sqrt(1.875 / 7); plus TRL's 1e-4."""
    groups = [_group("a", [1, 0, 0, 1]), _group("b", [1, 1, 1, 0])]
    name = "grpo_batch_std"
    settings = IterationSettings(advantage_estimator=name, batch_step=name)
    batch, _ = build_training_batch(groups, settings)
    centred = np.array([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])
    expected = centred / (math.sqrt(1.875 / 7) + 1e-4)
    np.testing.assert_allclose([s.advantage for s in batch], expected, rtol=1e-12)
    # The same estimator through the config: the batch step comes from the registry, with TRL's eps (not adv_eps).
    from r3_rllib import R3Config
    from r3_rllib.algorithms.r3.iteration_settings import iteration_settings

    made = iteration_settings(
        R3Config().training(advantage_estimator=name), dataset_epoch=0, policy_version=0
    )
    assert (made.batch_step, made.batch_step_params) == (name, {})


def test_remax_replayed_members_take_their_groups_greedy_baseline():
    # Fresh all-wrong group [0, 0] whose greedy response earned 0.25; replay adds a past success (no baseline).
    fresh = Group("a", [replace(_sample("a", 0.0, False), baseline_reward=0.25) for _ in range(2)])
    mixed = Group("b", [replace(_sample("b", r, r >= 1.0), baseline_reward=1.0) for r in (1.0, 0.0)])

    def fetch(requests):
        assert requests == [("a", True, 1)]
        return [[_sample("a", 1.0, True)]]

    settings = IterationSettings(replay=True, replay_k=1, advantage_estimator="remax")
    batch, m = build_training_batch([fresh, mixed], settings, fetch)
    # a: [0, 0, 1] - 0.25; b: [1, 0] - 1 (the greedy response was right: the wrong sample is pushed down).
    assert [(s.query_id, s.is_replay) for s in batch] == [
        ("a", False),
        ("a", False),
        ("a", True),
        ("b", False),
        ("b", False),
    ]
    np.testing.assert_allclose([s.advantage for s in batch], [-0.25, -0.25, 0.75, 0.0, -1.0])
    assert m["zero_adv_frac"] == 0.0
    with pytest.raises(ValueError, match="no member of the group has a greedy baseline reward"):
        build_training_batch([_group("c", [1.0, 0.0])], settings)


def test_gdpo_normalises_each_objective_apart_then_whitens_the_batch():
    """TRL's normalize_then_sum. Group a: env rewards [1, 0, 0], term 'fmt' (weight 0.5) [1, 1, 0]. Each has sample
    std sqrt(1/3) = s: env -> [2/3, -1/3, -1/3] / (s + 1e-4), fmt -> [1/3, 1/3, -2/3] / (s + 1e-4); the weighted sum
    [5/6, -1/6, -2/3] / (s + 1e-4). Group b: env [1, 1, 0] and fmt all 1: fmt's spread is 0 and adds nothing (the
    decoupling: GRPO on the composed reward would let it shift every score alike). The six sums are whitened over
    the batch (mean, then the sample std + 1e-4)."""
    s = math.sqrt(1 / 3) + 1e-4

    def sample(qid, env, fmt):
        return replace(_sample(qid, env + 0.5 * fmt, env >= 1.0), env_reward=env, reward_parts={"fmt": fmt})

    groups = [
        Group("a", [sample("a", 1.0, 1.0), sample("a", 0.0, 1.0), sample("a", 0.0, 0.0)]),
        Group("b", [sample("b", 1.0, 1.0), sample("b", 1.0, 1.0), sample("b", 0.0, 1.0)]),
    ]
    terms = [{"name": "fmt", "type": "rule", "function": "math", "weight": 0.5}]
    settings = IterationSettings(
        advantage_estimator="gdpo",
        advantage_params={"reward_models": terms, "env_reward_weight": 1.0},
        batch_step="gdpo",
    )
    batch, _ = build_training_batch(groups, settings)
    sums = np.array([5 / 6, -1 / 6, -2 / 3, 1 / 3, 1 / 3, -2 / 3]) / s
    expected = (sums - sums.mean()) / (sums.std(ddof=1) + 1e-4)
    np.testing.assert_allclose([x.advantage for x in batch], expected, rtol=1e-12)
    # Through the config: the terms and the env's weight reach the estimator, the batch step is registered.
    from r3_rllib import R3Config
    from r3_rllib.algorithms.r3.iteration_settings import iteration_settings

    cfg = R3Config().training(advantage_estimator="gdpo", reward_models=terms)
    made = iteration_settings(cfg, dataset_epoch=0, policy_version=0)
    assert made.batch_step == "gdpo" and made.advantage_params["reward_models"] == terms


def test_gdpo_is_refused_with_what_changes_only_the_composed_reward():
    from r3_rllib import R3Config

    def error(config) -> str:
        with pytest.raises(ValueError) as info:
            config.validate()
        return str(info.value)

    gate = [{"name": "fmt", "type": "rule", "function": "math", "gate": True}]
    gdpo = dict(advantage_estimator="gdpo")
    assert "the gate term 'fmt' overrides only" in error(R3Config().training(reward_models=gate, **gdpo))
    assert "a replayed sample carries no term scores" in error(R3Config.r3_preset().training(**gdpo))
    assert "overlong_shaping changes only" in error(R3Config.dapo_preset().training(**gdpo))
    assert "use_kl_in_reward changes only" in error(R3Config().training(use_kl_in_reward=True, **gdpo))
    R3Config.dapo_preset().training(overlong_shaping=False, **gdpo).validate()  # dynamic sampling is fine
