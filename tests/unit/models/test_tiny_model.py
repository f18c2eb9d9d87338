from __future__ import annotations

import pytest
import torch
from numeric import TORCH_THREADS
from repo_paths import SHARED_DATA
from transformers import AutoTokenizer

from r3_rllib.models import tiny
from r3_rllib.models.tiny import (
    CHARACTERS,
    build_tiny_model,
    build_tiny_model_for_tokenizer,
    build_tiny_tokenizer,
    load_tiny,
    load_tokenizer,
    save_tiny,
)

R1_TOKENIZER = SHARED_DATA / "tokenizers" / "r1_distill_qwen_1.5b"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(TORCH_THREADS)


def test_every_printable_character_is_one_token():
    tok = build_tiny_tokenizer()
    assert len(CHARACTERS) == 96  # 95 printable ASCII characters and the newline
    assert len(tok) == 100
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    ids = [tok.encode(c, add_special_tokens=False) for c in CHARACTERS]
    assert all(len(i) == 1 for i in ids)
    assert sorted(i[0] for i in ids) == list(range(4, 100))
    text = "".join(CHARACTERS) + "  12 + 34 =\n46"
    encoded = tok.encode(text)
    assert len(encoded) == len(text)  # no special token added on encode, one per character
    assert tok.decode(encoded) == text


def test_unknown_character_maps_to_unk():
    tok = build_tiny_tokenizer()
    assert tok.encode("1\u00e92") == [tok.convert_tokens_to_ids("1"), 3, tok.convert_tokens_to_ids("2")]


def test_tokenizer_round_trip_through_load_tokenizer(tmp_path):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden=32, layers=1, heads=2, kv_heads=1)
    save_tiny(model, tok, tmp_path)
    assert (tmp_path / tiny.MARKER_FILE).is_file()
    reloaded = load_tokenizer(tmp_path)
    text = " a  b\n~!" + "".join(CHARACTERS)
    assert reloaded.encode(text) == tok.encode(text)
    assert reloaded.decode(reloaded.encode(text)) == text
    assert reloaded.eos_token_id == 1 and reloaded.pad_token_id == 0
    # The trap load_tokenizer avoids: AutoTokenizer picks Qwen2Tokenizer from config.json and loses characters.
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    assert auto.decode(auto.encode(text, add_special_tokens=False)) != text


def test_parameter_count_matches_hand_computation():
    model = build_tiny_model(build_tiny_tokenizer())
    # embed 100*128; per layer q 128*128+128, k and v 128*64+64, o 128*128, mlp 3*128*384, two norms 2*128;
    # final norm 128; lm_head tied to the embedding.
    per_layer = (16384 + 128) + 2 * (8192 + 64) + 16384 + 3 * 128 * 384 + 2 * 128
    assert per_layer == 197_120
    assert sum(p.numel() for p in model.parameters()) == 100 * 128 + 4 * per_layer + 128 == 801_408
    assert "lm_head.weight" in model.state_dict()  # vLLM reloads need the tied key


def test_model_is_deterministic_for_a_seed():
    tok = build_tiny_tokenizer()
    a = build_tiny_model(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=5).state_dict()
    b = build_tiny_model(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=5).state_dict()
    c = build_tiny_model(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=6).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_model_save_load_round_trip(tmp_path):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, seed=1)
    save_tiny(model, tok, tmp_path)
    loaded, loaded_tok = load_tiny(tmp_path)
    assert loaded.dtype == torch.float32
    assert loaded.config.tie_word_embeddings
    ids = torch.tensor([tok.encode("12+34=46")])
    with torch.no_grad():
        # exact: a save/load round trip gives the same float32 weights, and the same input runs the same kernels
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=0, rtol=0)
    assert loaded_tok.encode("12+34=") == tok.encode("12+34=")


def test_bad_inputs_raise_clear_errors(tmp_path):
    tok = build_tiny_tokenizer()
    with pytest.raises(ValueError, match="divisible by heads"):
        build_tiny_model(tok, hidden=30, heads=4)
    with pytest.raises(ValueError, match="divisible by kv_heads"):
        build_tiny_model(tok, heads=4, kv_heads=3)
    with pytest.raises(FileNotFoundError, match="tokenizer folder not found"):
        load_tokenizer(tmp_path / "missing")


@pytest.mark.slow
@pytest.mark.skipif(not R1_TOKENIZER.is_dir(), reason=f"R1 tokenizer not found at {R1_TOKENIZER}")
def test_tiny_model_for_the_r1_tokenizer_runs_a_chat_template(tmp_path):
    tok = AutoTokenizer.from_pretrained(str(R1_TOKENIZER))
    model = build_tiny_model_for_tokenizer(tok, hidden=16, layers=1)
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 64 == 0
    assert model.config.eos_token_id == tok.eos_token_id == 151643
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    # A folder without the character marker reloads with AutoTokenizer (the chat template survives).
    save_tiny(model, tok, tmp_path)
    assert not (tmp_path / tiny.MARKER_FILE).exists()
    reloaded = load_tokenizer(tmp_path)
    assert reloaded.chat_template == tok.chat_template
