import dataclasses
import math
import pickle
from collections import Counter

import numpy as np
import pytest

from r3_rllib.replay.buffer import (
    PRIORITY_FNS,
    QueryReplayBuffer,
    QueryStats,
    ReplayConfig,
    SampleRequest,
    from_columns,
    recency_length_priority,
    to_columns,
)
from r3_rllib.types.samples import ReplaySample

_TOKEN = iter(range(10**9))


def make(qid="q", correct=True, version=0, length=3, truncated=False, reward=None, prompt=(1, 2)):
    """A sample with a unique response (tokens from a global counter) unless dedupe is being tested."""
    toks = [next(_TOKEN) % 30000 for _ in range(length)]
    return ReplaySample(
        query_id=qid,
        prompt_ids=list(prompt),
        response_ids=toks,
        behavior_logprobs=[-0.5] * length,
        reward=float(correct) if reward is None else reward,
        correct=correct,
        policy_version=version,
        truncated=truncated,
        response_text=f"answer {toks}",
    )


def test_sample_conversion_and_validation():
    s = make(length=4)
    assert s.prompt_ids.dtype == np.int32 and s.response_ids.dtype == np.int32
    assert s.behavior_logprobs.dtype == np.float32
    with pytest.raises(ValueError, match="query 'bad': behavior_logprobs"):
        ReplaySample("bad", [1], [1, 2], [0.0], 1.0, True, 0)


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(max_per_query=0), "max_per_query"),
        (dict(max_total_samples=0), "max_total_samples"),
        (dict(max_age=-1), "max_age"),
        (dict(recency_decay=0.0), "recency_decay"),
        (dict(truncated_priority=2.0), "truncated_priority"),
        (dict(priority="nope"), "unknown priority"),
    ],
)
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ReplayConfig(**kw)


def test_per_query_bound_per_outcome_class():
    buf = QueryReplayBuffer(max_per_query=2, max_age=None)
    c = [make(correct=True, version=v) for v in range(3)]
    w = [make(correct=False, version=v) for v in range(2)]
    buf.add(c + w)
    assert buf.num_stored("q") == (2, 2)
    assert len(buf) == 4
    got = buf.sample_opposite("q", want_correct=True, k=5, current_version=2)
    assert {s.policy_version for s in got} == {1, 2}  # the oldest correct one was evicted
    assert buf.metrics()["evicted_per_query"] == 1


def test_total_bound_evicts_globally_oldest():
    buf = QueryReplayBuffer(max_total_samples=3, max_age=None)
    samples = [make(qid=f"q{i}") for i in range(5)]
    buf.add(samples[:2])
    buf.add(samples[2:])
    assert len(buf) == 3
    assert [buf.num_stored(f"q{i}")[1] for i in range(5)] == [0, 0, 1, 1, 1]
    assert buf.metrics()["evicted_total"] == 2
    assert buf.metrics()["num_queries"] == 3  # emptied queries are dropped


def test_dedupe_replaces_identical_response():
    buf = QueryReplayBuffer(max_age=None)
    a = make(version=0)
    b = ReplaySample("q", [1, 2], a.response_ids.copy(), [-0.1] * 3, 1.0, True, policy_version=5)
    buf.add([a, b])
    assert len(buf) == 1 and buf.metrics()["deduplicated"] == 1
    (got,) = buf.sample_opposite("q", want_correct=True, k=2, current_version=5)
    assert got.policy_version == 5
    no_dedupe = QueryReplayBuffer(max_age=None, dedupe=False)
    no_dedupe.add([a, b])
    assert len(no_dedupe) == 2


def test_prompt_shared_per_query():
    buf = QueryReplayBuffer(max_age=None)
    a, b = make(), make()
    assert a.prompt_ids is not b.prompt_ids
    buf.add([a, b])
    got = buf.sample_opposite("q", want_correct=True, k=2, current_version=0)
    assert got[0].prompt_ids is got[1].prompt_ids


def test_priority_function_hand_computed():
    cfg = ReplayConfig(
        recency_decay=0.5, correct_length_power=1.0, incorrect_length_power=0.0, truncated_priority=0.1
    )
    cands = [make(version=4, length=2), make(version=3, length=4), make(version=4, length=8, truncated=True)]
    # correct: 0.5**lag * (2 / L) * (0.1 if truncated)
    assert recency_length_priority(cands, 4, True, cfg) == pytest.approx([1.0, 0.5 * 0.5, 0.25 * 0.1])
    # incorrect: no length preference
    assert recency_length_priority(cands, 4, False, cfg) == pytest.approx([1.0, 0.5, 0.1])
    # a version newer than current_version counts as lag 0
    assert recency_length_priority(cands, 2, False, cfg) == pytest.approx([1.0, 1.0, 0.1])
    assert PRIORITY_FNS["uniform"](cands, 4, True, cfg) == [1.0, 1.0, 1.0]


def _freqs(buf, qid, want_correct, k, n, current_version):
    counts = Counter()
    for _ in range(n):
        got = buf.sample_opposite(qid, want_correct=want_correct, k=k, current_version=current_version)
        counts[frozenset(s.policy_version for s in got) if k > 1 else got[0].policy_version] += 1
    return {key: v / n for key, v in counts.items()}


def test_sampling_probabilities_k1():
    # recency weights 1, 0.5, 0.25 (lags 0, 1, 2) -> 4/7, 2/7, 1/7
    buf = QueryReplayBuffer(recency_decay=0.5, incorrect_length_power=0.0, max_age=None, seed=1)
    buf.add([make(correct=False, version=v) for v in (2, 1, 0)])
    f = _freqs(buf, "q", False, 1, 20000, current_version=2)
    for v, p in {2: 4 / 7, 1: 2 / 7, 0: 1 / 7}.items():
        assert f[v] == pytest.approx(p, abs=0.012)


def test_sampling_without_replacement_k2():
    # successive sampling: P({a, b}) = 4/7 * 2/3 + 2/7 * 4/5 = 64/105, P({a, c}) = 4/7 * 1/3 + 1/7 * 2/3 = 30/105
    buf = QueryReplayBuffer(recency_decay=0.5, max_age=None, seed=2)
    buf.add([make(correct=False, version=v) for v in (2, 1, 0)])
    f = _freqs(buf, "q", False, 2, 20000, current_version=2)
    assert f[frozenset({2, 1})] == pytest.approx(64 / 105, abs=0.012)
    assert f[frozenset({2, 0})] == pytest.approx(30 / 105, abs=0.012)
    assert f[frozenset({1, 0})] == pytest.approx(11 / 105, abs=0.012)


def test_shorter_correct_preferred():
    buf = QueryReplayBuffer(correct_length_power=1.0, max_age=None, seed=3)
    short, long_ = make(version=0, length=2), make(version=1, length=4)
    short.policy_version = long_.policy_version = 1
    buf.add([short, long_])
    counts = Counter(
        len(buf.sample_opposite("q", want_correct=True, k=1, current_version=1)[0].response_ids)
        for _ in range(9000)
    )
    assert counts[2] / 9000 == pytest.approx(2 / 3, abs=0.015)


def test_zero_priority_never_returned():
    buf = QueryReplayBuffer(truncated_priority=0.0, max_age=None)
    buf.add([make(truncated=True), make(truncated=False)])
    for _ in range(50):
        got = buf.sample_opposite("q", want_correct=True, k=2, current_version=0)
        assert len(got) == 1 and not got[0].truncated


def test_seeded_determinism():
    def draws(seed):
        global _TOKEN
        _TOKEN = iter(range(10**9))
        buf = QueryReplayBuffer(seed=seed, max_age=None)
        buf.add([make(qid="q", version=0, length=3) for _ in range(6)])
        out = []
        for _ in range(20):
            got = buf.sample_opposite("q", want_correct=True, k=3, current_version=0)
            out.append(tuple(int(s.response_ids[0]) for s in got))
        return out

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_draw_order_is_the_exponential_race_of_the_seeded_generator():
    # weights (recency 0.5 per version, lags 0..3): 1, 0.5, 0.25, 0.125; the returned order must be
    # argsort(Exp(1) / w) for the first draw of default_rng(seed)
    buf = QueryReplayBuffer(recency_decay=0.5, incorrect_length_power=0.0, max_age=None, seed=42)
    buf.add([make(correct=False, version=v) for v in (3, 2, 1, 0)])
    e = np.random.default_rng(42).standard_exponential(4)
    expected = [3 - int(i) for i in np.argsort(e / np.array([1.0, 0.5, 0.25, 0.125]))]
    got = buf.sample_opposite("q", want_correct=False, k=4, current_version=3)
    assert [s.policy_version for s in got] == expected


def test_opposite_outcome_sampling_and_hit_miss_counts():
    buf = QueryReplayBuffer(max_age=None)
    buf.add([make(correct=True), make(correct=False), make(correct=False)])
    got = buf.sample_opposite("q", want_correct=True, k=3, current_version=0)
    assert len(got) == 1 and got[0].correct
    got = buf.sample_opposite("q", want_correct=False, k=2, current_version=0)
    assert len(got) == 2 and not any(s.correct for s in got)
    assert len({id(s) for s in got}) == 2  # without replacement
    assert buf.sample_opposite("unknown", want_correct=True, k=2, current_version=0) == []
    assert buf.sample_opposite("q", want_correct=True, k=0, current_version=0) == []
    m = buf.metrics()
    assert (m["sample_calls"], m["hits"], m["misses"]) == (4, 3, 4)
    with pytest.raises(ValueError, match="k must be"):
        buf.sample_opposite("q", want_correct=True, k=-1, current_version=0)


def test_sample_batch_matches_sequential_calls():
    def fill(seed):
        global _TOKEN
        _TOKEN = iter(range(10**9))
        buf = QueryReplayBuffer(seed=seed, max_age=None)
        buf.add([make(qid=f"q{i % 3}", correct=i % 2 == 0, version=i % 4) for i in range(24)])
        return buf

    reqs = [SampleRequest("q0", True, 2, 3), ("q1", False, 3, 3), SampleRequest("zz", True, 1, 3)]
    a = fill(5).sample_batch(reqs)
    b_buf = fill(5)
    b = [b_buf.sample_opposite(q, want_correct=w, k=k, current_version=v) for q, w, k, v in reqs]
    assert [[s.response_ids.tolist() for s in g] for g in a] == [
        [s.response_ids.tolist() for s in g] for g in b
    ]
    assert [len(g) for g in a] == [2, 3, 0]


def test_staleness_never_returned_and_evicted():
    buf = QueryReplayBuffer(max_age=2, max_per_query=10)
    buf.add([make(version=v) for v in range(4)])
    got = buf.sample_opposite("q", want_correct=True, k=10, current_version=4)  # min version 2
    assert sorted(s.policy_version for s in got) == [2, 3]
    assert len(buf) == 2 and buf.metrics()["evicted_stale"] == 2
    assert buf.evict_stale(6) == 2 and len(buf) == 0
    # now that version 6 is known, a sample already stale on arrival is counted in stats but not stored
    buf.add([make(version=3, reward=0.25)])
    assert len(buf) == 0
    assert buf.query_stats(["q"])["q"].n_seen == 5
    assert buf.nbytes() == 0


def test_evict_stale_from_old_end_and_lazy_for_out_of_order():
    buf = QueryReplayBuffer(max_age=1)
    buf.add(
        [
            make(qid="a", version=0),
            make(qid="a", version=1),
            make(qid="b", version=5),
            make(qid="c", version=0),
        ]
    )
    assert buf.evict_stale(5) == 2  # stops at b (version 5); c (version 0) is behind it
    assert len(buf) == 2
    assert buf.sample_opposite("c", want_correct=True, k=1, current_version=5) == []  # never returned
    assert len(buf) == 1
    no_limit = QueryReplayBuffer(max_age=None)
    no_limit.add([make(version=0)])
    assert no_limit.evict_stale(100) == 0
    assert len(no_limit.sample_opposite("q", want_correct=True, k=1, current_version=100)) == 1


def test_query_stats_over_all_samples_ever_added():
    buf = QueryReplayBuffer(max_per_query=1, max_age=None)
    buf.add(
        [make(correct=True, reward=1.0), make(correct=False, reward=0.0), make(correct=False, reward=0.2)]
    )
    buf.add([make(correct=True, reward=0.6)])
    assert buf.num_stored("q") == (1, 1)
    st = buf.query_stats(["q", "nope"])
    assert st["q"] == QueryStats(4, 2, pytest.approx(0.45))
    assert st["nope"].n_seen == 0 and math.isnan(st["nope"].mean_reward)
    assert buf.mean_past_rewards(["q", "nope"]) == {"q": pytest.approx(0.45)}
    assert buf.mean_past_rewards() == {"q": pytest.approx(0.45)}


def test_sample_wrong_answer():
    buf = QueryReplayBuffer(truncated_priority=0.0, max_age=None)
    assert buf.sample_wrong_answer("q", 0) is None
    buf.add([make(correct=True), make(correct=False, truncated=True)])
    assert buf.sample_wrong_answer("q", 0) is None  # only a truncated one, weight 0
    wrong = make(correct=False)
    buf.add([wrong])
    for _ in range(5):
        got = buf.sample_wrong_answer("q", 0)
        assert got is not None and got.response_text == wrong.response_text
    assert buf.sample_wrong_answers(["q", "x"], 0)[1] is None
    m = buf.metrics()
    assert (m["reflection_hits"], m["reflection_misses"]) == (6, 3)


def test_nbytes_accounting():
    buf = QueryReplayBuffer(max_age=0)
    assert buf.nbytes() == 0
    a, b = make(length=10, version=0), make(length=20, version=0)
    buf.add([a, b])
    expected = a.nbytes() + b.nbytes() - a.prompt_ids.nbytes  # the shared prompt counted once
    assert buf.nbytes() == expected
    buf.evict_stale(1)
    assert len(buf) == 0 and buf.nbytes() == 0


def test_nbytes_counts_a_tool_trajectorys_loss_mask():
    plain = make(length=10)
    masked = dataclasses.replace(plain, loss_mask=np.ones(10, dtype=bool))
    assert masked.nbytes() == plain.nbytes() + 10  # one byte per response token


def test_columns_round_trip():
    samples = [make(qid="a"), make(qid="a"), make(qid="b", prompt=(7,), length=0)]
    out = from_columns(pickle.loads(pickle.dumps(to_columns(samples))))
    for x, y in zip(samples, out, strict=True):
        for f in ("query_id", "reward", "correct", "policy_version", "truncated", "response_text"):
            assert getattr(x, f) == getattr(y, f)
        for f in ("prompt_ids", "response_ids", "behavior_logprobs"):
            np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
            assert getattr(y, f).dtype == getattr(x, f).dtype
    assert out[0].prompt_ids is out[1].prompt_ids
    assert from_columns(to_columns([])) == []
    assert all(y.loss_mask is None for y in out)  # single-turn samples stay without a mask


def test_tool_token_masks_survive_the_columns_and_are_checked():
    from dataclasses import replace

    plain, tool = make(qid="a", length=4), make(qid="b", length=5)
    tool = replace(tool, loss_mask=[True, False, False, True, True])
    out = from_columns(pickle.loads(pickle.dumps(to_columns([plain, tool]))))
    assert out[0].loss_mask.tolist() == [True] * 4  # a batch with any mask carries one for every sample
    assert out[1].loss_mask.tolist() == [True, False, False, True, True]
    with pytest.raises(ValueError, match="loss_mask"):
        replace(tool, loss_mask=[True])


def test_state_round_trip_is_exact():
    buf = QueryReplayBuffer(max_per_query=3, max_age=3, seed=11)
    buf.add([make(qid=f"q{i % 4}", correct=i % 3 == 0, version=i // 5, length=1 + i % 5) for i in range(40)])
    for i in range(7):
        buf.sample_opposite(f"q{i % 4}", want_correct=bool(i % 2), k=2, current_version=7)
    state = pickle.loads(pickle.dumps(buf.get_state()))
    clone = QueryReplayBuffer(seed=999)
    clone.set_state(state)
    assert clone.config == buf.config
    assert len(clone) == len(buf) and clone.nbytes() == buf.nbytes() and clone.metrics() == buf.metrics()
    assert clone.query_stats([f"q{i}" for i in range(4)]) == buf.query_stats([f"q{i}" for i in range(4)])
    reqs = [(f"q{i % 4}", bool(i % 3), 2, 8) for i in range(30)]
    got_a = [[s.response_ids.tolist() for s in g] for g in buf.sample_batch(reqs)]
    got_b = [[s.response_ids.tolist() for s in g] for g in clone.sample_batch(reqs)]
    assert got_a == got_b
    assert clone.get_state()["rng_state"] == buf.get_state()["rng_state"]
    with pytest.raises(ValueError, match="state version"):
        clone.set_state({"version": 0})


def test_a_state_saved_with_the_former_field_name_restores():
    """Replay states of older versions name the age bound ``max_staleness`` (now ``max_age``)."""
    buf = QueryReplayBuffer(max_per_query=3, max_age=3, seed=11)
    buf.add([make(qid="q", correct=True, version=2)])
    state = buf.get_state()
    state["config"]["max_staleness"] = state["config"].pop("max_age")
    clone = QueryReplayBuffer()
    clone.set_state(state)
    assert clone.config == buf.config and len(clone) == 1
    assert ReplayConfig.from_dict({"max_staleness": None}).max_age is None
