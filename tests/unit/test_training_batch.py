"""`TrainingBatch`: the columnar batch the driver sends to the learners, and its packing into the learner's input."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from r3_rllib.algorithms.r3.rl_module import pack_batch, pack_samples
from r3_rllib.types import TRAINING_BATCH_FORMAT, TrainingBatch


def _samples(n: int, seed: int = 0) -> list[SimpleNamespace]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        response = rng.integers(5, 60, size=int(rng.integers(0, 6))).tolist()
        out.append(
            SimpleNamespace(
                prompt_ids=rng.integers(5, 60, size=int(rng.integers(1, 9))).tolist(),
                response_ids=response,
                # one log-prob more than tokens: the batch keeps the response's length
                behavior_logprobs=rng.normal(size=len(response) + 1).astype(np.float32),
                advantage=float(rng.normal()),
                policy_version=i % 3,
            )
        )
    return out


def _pack_by_hand(samples, pad_id: int) -> dict[str, torch.Tensor]:
    """The per-sample packing the columnar one replaces (right padding, log-prob positions one to the left)."""
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    resp = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
    behav = torch.zeros((len(seqs), width - 1), dtype=torch.float32)
    for b, (s, seq) in enumerate(zip(samples, seqs, strict=True)):
        ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, : len(seq)] = 1
        start, n = len(s.prompt_ids) - 1, len(s.response_ids)
        resp[b, start : start + n] = True
        behav[b, start : start + n] = torch.tensor(np.asarray(s.behavior_logprobs, dtype=np.float32)[:n])
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "response_mask": resp,
        "behavior_logprobs": behav,
        "advantages": advantages,
    }


def test_packing_matches_the_per_sample_packing_for_any_rows():
    samples = _samples(9)
    batch = TrainingBatch.from_samples(samples)
    assert len(batch) == 9 and batch.format == TRAINING_BATCH_FORMAT
    assert batch.lengths.tolist() == [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    for rows in ([0, 1, 2, 3, 4, 5, 6, 7, 8], [7, 2, 2, 0], [4]):
        got = pack_batch(batch, rows, 3, "cpu")
        want = _pack_by_hand([samples[i] for i in rows], 3)
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key].dtype == value.dtype, key
            assert torch.equal(got[key], value), key
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            pack_samples(samples, 0, "cpu").values(), _pack_by_hand(samples, 0).values(), strict=True
        )
    )


def test_take_keeps_each_row_whole_and_the_batch_pickles_as_arrays():
    batch = TrainingBatch.from_samples(_samples(6))
    part = batch.take([5, 1])
    assert len(part) == 2 and part.policy_versions.tolist() == [2, 1]
    for key, value in part.padded([0, 1], 0).items():
        np.testing.assert_array_equal(value, batch.padded([5, 1], 0)[key], err_msg=key)
    again = pickle.loads(pickle.dumps(batch))
    np.testing.assert_array_equal(again.response_ids, batch.response_ids)
    assert again.prompt_ids.dtype == np.int32 and again.behavior_logprobs.dtype == np.float32


def test_unknown_formats_and_inconsistent_arrays_are_refused():
    batch = TrainingBatch.from_samples(_samples(3))
    fields = {k: getattr(batch, k) for k in batch.__dataclass_fields__}
    unknown = TRAINING_BATCH_FORMAT + 1  # a newer sender's batch
    with pytest.raises(ValueError, match=f"format {unknown}"):
        TrainingBatch(**{**fields, "format": unknown})
    with pytest.raises(ValueError, match="response_offsets"):
        TrainingBatch(**{**fields, "response_offsets": fields["response_offsets"][:-1]})
    short = SimpleNamespace(
        prompt_ids=[1], response_ids=[2, 3], behavior_logprobs=[0.0], advantage=0.0, policy_version=0
    )
    with pytest.raises(ValueError, match="behaviour log-probs"):
        TrainingBatch.from_samples([short])
    with pytest.raises(ValueError, match="prompt of at least one token"):
        TrainingBatch.from_samples(
            [SimpleNamespace(**{**vars(short), "prompt_ids": [], "behavior_logprobs": [0.0, 0.0]})]
        )


def test_loss_mask_follows_rows_and_leaves_tool_tokens_unscored():
    samples = _samples(7, seed=3)
    rng = np.random.default_rng(4)
    for i, s in enumerate(samples):
        s.loss_mask = None if i % 3 == 0 else rng.random(len(s.response_ids)) < 0.6
    batch = TrainingBatch.from_samples(samples)
    rows = np.array([5, 1, 3])
    packed = batch.padded(rows, pad_id=0)
    by_hand = _pack_by_hand([samples[r] for r in rows], pad_id=0)["response_mask"].numpy()
    for b, r in enumerate(rows):  # the unmasked response positions, less the tool tokens
        s = samples[r]
        mask = np.ones(len(s.response_ids), bool) if s.loss_mask is None else s.loss_mask
        start = len(s.prompt_ids) - 1
        expected = by_hand[b].copy()
        expected[start : start + len(mask)] &= mask
        assert (packed["response_mask"][b] == expected).all()
    sub = batch.take(rows)
    assert (sub.padded(np.arange(3), pad_id=0)["response_mask"] == packed["response_mask"]).all()
    expected_trained = [
        int(np.sum(samples[r].loss_mask))
        if samples[r].loss_mask is not None
        else len(samples[r].response_ids)
        for r in range(7)
    ]
    assert batch.trained_tokens.tolist() == expected_trained
    assert TrainingBatch.from_samples(_samples(3)).loss_mask is None  # single-turn batches carry no mask
