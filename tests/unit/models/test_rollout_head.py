"""R^2PO's rollout head on the tiny random Qwen2: rollout vs inference logits, log-probs, files, stages, sampling."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, forward_atol
from safetensors import safe_open

from r3_rllib.engines.base import SamplingParams
from r3_rllib.engines.hf_engine import HFEngine
from r3_rllib.engines.rollout_head_sampling import RolloutHeadHFEngine
from r3_rllib.models.rollout_head import (
    HEAD_CONFIG_FILE,
    HEAD_WEIGHTS_FILE,
    RolloutHead,
    attach_rollout_head,
    detach_rollout_head,
    export_policy,
    get_rollout_head,
    has_rollout_head,
    load_policy_with_head,
    load_rollout_head,
    rollout_logits,
    rollout_logits_enabled,
    rollout_token_logprobs,
    save_rollout_head,
    split_rollout_head_state,
)
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer
from r3_rllib.r2po.method import set_stage_trainable

torch.set_num_threads(TORCH_THREADS)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _model(tok, seed: int = 0):
    return build_tiny_model(tok, hidden=64, layers=2, heads=4, kv_heads=2, seed=seed)


def _ids(tok, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask (rows of different lengths)."""
    rows = [tok.encode(t) for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - len(r) :] = torch.tensor(r)
        mask[b, width - len(r) :] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def test_head_layout_and_near_zero_init():
    head = RolloutHead(64, 99, seed=3)
    assert head.hidden_proj.weight.shape == (64, 64) and head.vocab_proj.weight.shape == (99, 64)
    assert head.hidden_proj.bias is None and head.vocab_proj.bias is None
    for w in (head.hidden_proj.weight, head.vocab_proj.weight):
        assert 0.8e-6 < float(w.detach().std()) < 1.2e-6
    # seeded init: reproducible and the global RNG is left alone
    state = torch.random.get_rng_state()
    assert torch.equal(RolloutHead(64, 99, seed=3).vocab_proj.weight, head.vocab_proj.weight)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert head(torch.randn(2, 5, 64)).shape == (2, 5, 99)
    with pytest.raises(ValueError, match="never learns"):
        RolloutHead(64, 99, init_std=0.0)
    with pytest.raises(ValueError, match="width"):
        head(torch.randn(3, 32))


def test_rollout_logits_by_hand():
    head = RolloutHead(2, 3)
    with torch.no_grad():
        head.hidden_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
        head.vocab_proj.weight.copy_(torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 3.0]]))
    # W1 [1, 2] = [1, -2] -> relu [1, 0] -> W2 -> [1, 2, 0]; plus lm_logits 0.5
    out = rollout_logits(torch.full((1, 3), 0.5), torch.tensor([[1.0, 2.0]]), head)
    assert out.tolist() == [[1.5, 2.5, 0.5]]
    with pytest.raises(ValueError, match="leading shape"):
        rollout_logits(torch.zeros(2, 3), torch.zeros(1, 2), head)


def test_head_changes_rollout_logits_not_inference_logits(tok):
    model = _model(tok)
    ids, mask = _ids(tok, ["12+34=46", "7+8="])
    kw = dict(input_ids=ids, attention_mask=mask, position_ids=_positions(mask))
    with torch.no_grad():
        base = model(**kw).logits
        head = attach_rollout_head(model, seed=1)
        head.reset_parameters(0.3, seed=2)  # a head large enough to matter
        assert torch.equal(model(**kw).logits, base)  # attached, switched off: base logits, bit for bit
        with rollout_logits_enabled(model):
            out = model(**kw, output_hidden_states=True)
        assert torch.equal(model(**kw).logits, base)  # switched off again on leaving the block
    diff = (out.logits - base).abs().max()
    assert diff > 0.1
    # the head applied by hand on the same hidden states: other sums (forward_atol, tests/numeric.py)
    want = rollout_logits(base, out.hidden_states[-1], head)
    torch.testing.assert_close(out.logits, want, rtol=0, atol=forward_atol(want))
    # logits_to_keep (generation's prefill) cuts the hidden states before the head sees them
    with torch.no_grad(), rollout_logits_enabled(model):
        last = model(**kw, logits_to_keep=1).logits
    torch.testing.assert_close(last, out.logits[:, -1:], rtol=0, atol=forward_atol(out.logits[:, -1:]))


@pytest.mark.parametrize(
    "scored_rows_only", [True, False], ids=["lm-head-on-scored-rows", "full-logits-fallback"]
)
def test_token_logprobs_match_full_softmax(tok, monkeypatch, scored_rows_only):
    import r3_rllib.core.logprobs as logprobs_module

    if not scored_rows_only:  # a model whose forward takes no logits_to_keep
        monkeypatch.setattr(logprobs_module, "_head_swap_supported", lambda model: False)
    model = _model(tok)
    head = attach_rollout_head(model, seed=1)
    head.reset_parameters(0.3, seed=2)
    ids, mask = _ids(tok, ["12+34=46", "7+8=15", "99+1=100"])
    resp = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
    resp[:, -3:] = True  # score the last three tokens of every row
    resp[1, -1] = False
    seen: list[int] = []
    lm_out: list[tuple[int, ...]] = []
    hooks = [
        head.register_forward_hook(lambda m, a, o: seen.append(a[0].shape[0])),
        model.lm_head.register_forward_hook(lambda m, a, o: lm_out.append(tuple(o.shape))),
    ]
    temperature = 0.7
    with rollout_logits_enabled(model):  # the result must not depend on the switch
        roll, base = rollout_token_logprobs(model, ids, mask, resp, temperature=temperature)
    for h in hooks:
        h.remove()
    n = int(resp.sum())
    assert seen == [n]  # the rollout head ran on the 8 scored positions, not on B * L
    # One LM head call: on the scored rows only, which it turns into their log-probs, or the full logits.
    assert lm_out == ([(n,)] if scored_rows_only else [(*ids.shape, len(tok))])
    kw = dict(input_ids=ids, attention_mask=mask, position_ids=_positions(mask))
    with torch.no_grad():
        full_base = model(**kw).logits[:, :-1]
        with rollout_logits_enabled(model):
            full_roll = model(**kw).logits[:, :-1]
    for got, full in ((roll, full_roll), (base, full_base)):
        want = torch.log_softmax(full / temperature, -1).gather(-1, ids[:, 1:, None])[..., 0]
        torch.testing.assert_close(
            got[resp], want[resp], rtol=0, atol=forward_atol(want[resp])
        )  # forward_atol: FORWARD_ULPS of the scale (tests/numeric.py)
        assert torch.all(got[~resp] == 0)
    assert (roll[resp] - base[resp]).abs().max() > 0.05
    # one pass gives gradients to both parts; set_stage_trainable decides which parts keep them
    (roll.sum() + base.sum()).backward()
    assert head.vocab_proj.weight.grad is not None and model.model.embed_tokens.weight.grad is not None
    with pytest.raises(ValueError, match="temperature"):
        rollout_token_logprobs(model, ids, mask, resp, temperature=0.0)
    with pytest.raises(ValueError, match="response_mask"):
        rollout_token_logprobs(model, ids, mask, resp[:, 1:])


def test_state_dict_prefix_deepcopy_and_detach(tok):
    model = _model(tok)
    plain_keys = set(model.state_dict())
    head = attach_rollout_head(model, seed=1)
    keys = set(model.state_dict())
    assert keys - plain_keys == {"rollout_head.hidden_proj.weight", "rollout_head.vocab_proj.weight"}
    base_sd, head_sd = split_rollout_head_state(model.state_dict())
    assert set(base_sd) == plain_keys and set(head_sd) == {"hidden_proj.weight", "vocab_proj.weight"}
    assert {id(p) for p in head.parameters()} <= {id(p) for p in model.parameters()}
    with pytest.raises(ValueError, match="already has a rollout head"):
        attach_rollout_head(model)
    # a deep copy hooks its own head (the learner's reference or a runner's copy must not share the original's)
    twin = copy.deepcopy(model)
    twin_head = get_rollout_head(twin)
    assert twin_head is not head
    with torch.no_grad():
        twin_head.reset_parameters(0.3, seed=5)
    ids = torch.tensor([tok.encode("1+2=3")])
    with torch.no_grad():
        base = model(ids).logits
        with rollout_logits_enabled(model):
            # the original head is still near zero: atol is its own contribution (weights of std 1e-6), rtol (the
            # default 1e-5, ~80 float32 ulps) the rounding of adding it
            assert torch.allclose(model(ids).logits, base, atol=1e-6)
        with rollout_logits_enabled(twin):
            assert (twin(ids).logits - base).abs().max() > 0.1
    assert detach_rollout_head(model) is head
    assert set(model.state_dict()) == plain_keys and get_rollout_head(model) is None
    with pytest.raises(ValueError, match="no rollout head"):
        set_stage_trainable(model, "A")


def test_save_load_and_export(tok, tmp_path):
    from transformers import AutoModelForCausalLM

    model = _model(tok)
    head = attach_rollout_head(model, seed=1)
    head.reset_parameters(0.2, seed=4)
    ids = torch.tensor([tok.encode("12+34=46")])
    with torch.no_grad():
        base = model(ids).logits
        with rollout_logits_enabled(model):
            roll = model(ids).logits

    save_rollout_head(head, tmp_path / "h")
    assert has_rollout_head(tmp_path / "h")
    assert json.loads((tmp_path / "h" / HEAD_CONFIG_FILE).read_text())["hidden_size"] == 64
    again = load_rollout_head(tmp_path / "h")
    for k, v in head.state_dict().items():
        assert torch.equal(again.state_dict()[k], v)
    assert load_rollout_head(tmp_path / "h", dtype=torch.bfloat16).vocab_proj.weight.dtype == torch.bfloat16

    # policy alone: an ordinary HF folder with no head inside, loadable by AutoModelForCausalLM
    export_policy(model, tmp_path / "plain", tokenizer=tok)
    assert not has_rollout_head(tmp_path / "plain")
    with safe_open(str(tmp_path / "plain" / "model.safetensors"), "pt") as f:
        assert not any(k.startswith("rollout_head") for k in f.keys())
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "plain"))
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, base)
    assert get_rollout_head(model) is head and "rollout_head.vocab_proj.weight" in model.state_dict()

    # with the head beside it: the pair comes back, rollout logits included
    export_policy(model, tmp_path / "pair", with_head=True)
    assert (tmp_path / "pair" / HEAD_WEIGHTS_FILE).is_file()
    pair = load_policy_with_head(tmp_path / "pair", require_head=True)
    with torch.no_grad():
        assert torch.equal(pair(ids).logits, base)
        with rollout_logits_enabled(pair):
            assert torch.equal(pair(ids).logits, roll)
    with pytest.raises(FileNotFoundError, match="no rollout head"):
        load_policy_with_head(tmp_path / "plain", require_head=True)
    fresh = get_rollout_head(load_policy_with_head(tmp_path / "plain", seed=0))
    assert float(fresh.vocab_proj.weight.detach().abs().max()) < 1e-4

    (tmp_path / "bad").mkdir()
    save_rollout_head(RolloutHead(64, 50), tmp_path / "bad")
    cfg = json.loads((tmp_path / "bad" / HEAD_CONFIG_FILE).read_text())
    cfg["vocab_size"] = 99
    (tmp_path / "bad" / HEAD_CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="do not match"):
        load_rollout_head(tmp_path / "bad")
    with pytest.raises(FileNotFoundError):
        load_rollout_head(tmp_path / "nowhere")


@pytest.mark.parametrize("stage", ["A", "B"])
def test_one_step_per_stage_leaves_the_frozen_part_bit_identical(tok, stage):
    model = _model(tok)
    head = attach_rollout_head(model, seed=1)
    head.reset_parameters(0.05, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)  # one optimizer for both stages
    trainable, frozen = set_stage_trainable(model, stage)
    head_numel = sum(p.numel() for p in head.parameters())
    total = sum(p.numel() for p in model.parameters())
    assert (trainable, frozen) == (
        (head_numel, total - head_numel) if stage == "A" else (total - head_numel, head_numel)
    )
    assert {p.requires_grad for p in head.parameters()} == {stage == "A"}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = _ids(tok, ["12+34=46", "5+5=10"])
    roll, base = rollout_token_logprobs(model, ids, mask)
    # both terms, so the frozen part would receive a gradient if freezing failed
    loss = -(roll.sum() + base.sum())
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = model.state_dict()
    head_changed = [
        k for k in before if k.startswith("rollout_head.") and not torch.equal(before[k], after[k])
    ]
    base_changed = [
        k for k in before if not k.startswith("rollout_head.") and not torch.equal(before[k], after[k])
    ]
    if stage == "A":
        assert len(head_changed) == 2 and base_changed == []
    else:
        assert head_changed == [] and len(base_changed) > 10
    with pytest.raises(ValueError, match="stage"):
        set_stage_trainable(model, "C")


def test_near_zero_head_samples_what_the_base_samples(tok):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    prompts = [tok.encode("12+34="), tok.encode("7+8=")]
    base = HFEngine(_model(tok), tok).generate(prompts, 4, params)
    engine = RolloutHeadHFEngine(_model(tok), tok, head_seed=3)  # default init std 1e-6
    assert engine.rollout_logits
    with_head = engine.generate(prompts, 4, params)
    for row_b, row_h in zip(base, with_head, strict=True):
        for cb, ch in zip(row_b, row_h, strict=True):
            assert cb.token_ids == ch.token_ids
            # forward_atol (tests/numeric.py) plus the near-zero head's own contribution (std 1e-6 weights)
            np.testing.assert_allclose(
                ch.logprobs, cb.logprobs, rtol=0, atol=forward_atol(cb.logprobs) + 1e-6
            )


def test_large_head_changes_samples_and_can_be_switched_off(tok, tmp_path):
    params = SamplingParams(max_new_tokens=12, temperature=0.8, seed=7)
    prompts = [tok.encode("12+34="), tok.encode("7+8=")]
    base = HFEngine(_model(tok), tok).generate(prompts, 4, params)
    head = RolloutHead(64, len(tok), init_std=0.5, seed=11)
    engine = RolloutHeadHFEngine(_model(tok), tok, head=head)
    with_head = engine.generate(prompts, 4, params)
    flat_b = [c.token_ids for row in base for c in row]
    flat_h = [c.token_ids for row in with_head for c in row]
    assert sum(a != b for a, b in zip(flat_b, flat_h, strict=True)) >= 6
    # the engine's log-probs are the rollout distribution's: the scorer agrees with the sampler
    c = with_head[0][0]
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    roll, base_lp = rollout_token_logprobs(engine.model, ids, temperature=0.8)
    n = len(c.token_ids)
    np.testing.assert_allclose(
        roll[0, -n:].detach().numpy(), c.logprobs, rtol=0, atol=forward_atol(c.logprobs)
    )
    assert np.abs(base_lp[0, -n:].detach().numpy() - c.logprobs).max() > 0.05
    engine.set_rollout_logits(False)  # evaluation: the base policy's samples
    assert [c.token_ids for row in engine.generate(prompts, 4, params) for c in row] == flat_b
    # from a folder: the head saved beside the policy is loaded and samples as before
    export_policy(_model_with(head, tok), tmp_path / "p", with_head=True, tokenizer=tok)
    from_dir = RolloutHeadHFEngine(tmp_path / "p")
    assert torch.equal(from_dir.head.vocab_proj.weight, head.vocab_proj.weight)
    assert [c.token_ids for row in from_dir.generate(prompts, 4, params) for c in row] == flat_h
    # weight sync carries the head under rollout_head.*: a zeroed head samples the base policy again
    from_dir.update_weights([("rollout_head.vocab_proj.weight", torch.zeros(len(tok), 64))], version=3)
    assert from_dir.version == 3 and not from_dir.head.vocab_proj.weight.any()
    assert [c.token_ids for row in from_dir.generate(prompts, 4, params) for c in row] == flat_b


def _model_with(head: RolloutHead, tok):
    model = _model(tok)
    attach_rollout_head(model, copy.deepcopy(head))
    return model
